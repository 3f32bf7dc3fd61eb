"""`simkit layers`: list a model's layers (the names that --layers selectors match) with output shapes."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from simkit.cli.common import FLAG, SeedOpt, TrustOpt, WeightsOpt, command, load_cli_model


@command("layers", help=(
    "List the layers of MODEL that capture can hook: name, type, output shape (from a dry run on one "
    "sample of --data), parameter count, and whether the `blocks` preset picks it.\n\n"
    "MODEL is a model spec: torchvision:resnet18, timm:NAME, hf:DIR, file:PATH, python:pkg.mod:fn, "
    "simkit:cnn1d. Without --data the dry run uses the model's own example input (the simkit zoo), "
    "3x224x224 zeros (torchvision classifiers) or a default sentence through its own tokenizer (hf:DIR); "
    "for other models the shape column stays empty."))
def layers_command(
    model: Annotated[str, typer.Argument(help="Model spec.")],
    data: Annotated[str | None, typer.Option(
        "--data", help="Data spec for the dry run (mnist1d, digits, synthetic:SHAPE, npy:PATH, ...).")] = None,
    seed: SeedOpt = 0,
    trust: TrustOpt = False,
    select: Annotated[str | None, typer.Option(
        "--select", help="Show only these layers: names, globs, type:Class, blocks (comma list).")] = None,
    weights: WeightsOpt = None,
    tokenizer: Annotated[str | None, typer.Option(
        "--tokenizer", help="hf:DIR whose tokenizer reads text:FILE data (default: MODEL when it is hf:).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON records.", metavar=FLAG)] = False,
) -> None:
    """`simkit layers`: print MODEL's hookable layers (name, type, shape, parameters) as a table or JSON."""
    from simkit.layers import resolve_layers

    module = load_cli_model(model, seed=seed, trust=trust, weights=weights)
    sample, source = _dry_run_sample(module, model, data, seed, tokenizer)
    table = _layer_table(module, sample, model, source)
    if select is not None:
        table = table[table["name"].isin(resolve_layers(module, select))]
    note = (f"output shapes from one sample of {source}" if sample is not None
            else "no output shapes: pass --data SPEC for a dry run")
    if as_json:
        typer.echo(json.dumps(table.to_dict(orient="records"), indent=1, default=int))
        typer.echo(note, err=True)
        return
    _print_table(table, model, note)


def _dry_run_sample(module, model: str, data: str | None, seed: int, tokenizer: str | None):
    """The input of the dry run: one sample of ``data`` (read with ``tokenizer``, default MODEL when it is
    hf:), else the model's own (:func:`_model_sample`). Returns (sample or None, description)."""
    from simkit.data import load_data

    if data is None:
        return _model_sample(module, model)
    if tokenizer is None and model.startswith("hf:"):
        tokenizer = model
    return load_data(data, n=1, seed=seed, tokenizer=tokenizer).take(slice(0, 1)).inputs, data


def _layer_table(module, sample, model: str, source: str | None):
    """``simkit.layers.layer_table`` of ``module`` on ``sample``; a model that cannot run on it is a
    one-line SimkitError naming the data."""
    from simkit.errors import SimkitError
    from simkit.layers import layer_table

    try:
        return layer_table(module, sample)
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SimkitError):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SimkitError(f"model {model!r} cannot run on one sample of {source!r} ({first}); "
                          "check that --data fits the model") from None


PROBE_SENTENCE = "The quick brown fox jumps over the lazy dog."


def _model_sample(module, spec: str):
    """A dry-run input the model itself defines: ``example_input()`` (the simkit zoo), 3×224×224 for
    torchvision classification models, or :data:`PROBE_SENTENCE` through the tokenizer of an ``hf:``
    model. Returns (sample or None, description)."""
    import torch

    if spec.startswith("hf:"):
        from simkit.models.loading import hf_tokenizer

        encoded = hf_tokenizer(spec)([PROBE_SENTENCE], return_tensors="pt")
        sample = {key: encoded[key] for key in ("input_ids", "attention_mask") if key in encoded}
        return sample, f"the sentence {PROBE_SENTENCE!r} through the model's own tokenizer"

    if callable(getattr(module, "example_input", None)):
        sample = module.example_input()
        return sample, "the model's example_input() (zeros " + "x".join(map(str, sample.shape[1:])) + ")"
    if spec.startswith("torchvision:"):
        import torchvision

        name = spec.split(":")[1]
        if name in torchvision.models.list_models(module=torchvision.models):
            return torch.zeros(1, 3, 224, 224), "zeros 3x224x224 (torchvision's classification size)"
    return None, None


def _print_table(table, model: str, note: str) -> None:
    from rich.console import Console
    from rich.table import Table

    view = Table(title=f"layers of {model}", title_justify="left", caption=note, caption_justify="left")
    view.add_column("name", overflow="fold")
    view.add_column("type")
    view.add_column("output shape")
    view.add_column("params", justify="right")
    view.add_column("blocks", justify="center")
    for row in table.itertuples(index=False):
        view.add_row(row.name, row.type, row.shape, f"{row.params:,}", "✓" if row.blocks else "")
    Console(width=max(100, Console().width), highlight=False).print(view)
