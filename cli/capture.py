"""`simkit capture`: write a model's layer activations once, to compare later without the model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
    DataOpt,
    DataSeedOpt,
    DeviceOpt,
    NOpt,
    SeedOpt,
    TrustOpt,
    command,
    load_cli_model,
)


@command("capture", help=(
    "Run MODEL over the data once and write the chosen layers' activations to --out as safetensors "
    "shards plus manifest.json. Compare two caches with `simkit compare DIR_A DIR_B`, or three or "
    "more for a model × model study."))
def capture_command(
    model: Annotated[str, typer.Argument(help="Model spec, e.g. torchvision:resnet18.")],
    out: Annotated[Path, typer.Option("--out", help="Cache directory to write.")],
    data: DataOpt = "synthetic:3x64x64",
    n: NOpt = None,
    layers: Annotated[str, typer.Option("--layers", help="Names, globs, type:Class, presets (blocks).")] = "blocks",
    reduce: Annotated[str, typer.Option("--reduce", help="How a layer's output becomes a vector per sample: auto, "
        "flatten, mean, cls or last; auto = the mask-aware mean over the tokens of a sequence, flatten for "
        "everything else.")] = "auto",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per forward pass.")] = 64,
    weights: Annotated[Path | None, typer.Option("--weights", help="Local weights file.")] = None,
    seed: SeedOpt = 0,
    data_seed: DataSeedOpt = 0,
    device: DeviceOpt = "cpu",
    trust: TrustOpt = False,
) -> None:
    """`simkit capture`: run MODEL over the data once and cache the chosen layers' activations in --out."""
    from simkit.engine import capture
    from simkit.engine.loading import data_for
    from simkit.report.headline import capture_headline, read_manifest

    dataset = data_for(data, model, n=n, seed=data_seed)
    module = load_cli_model(model, seed=seed, trust=trust, weights=weights)
    path = capture(module, dataset, out, layers=layers, reduce=reduce, batch_size=batch_size, n=n,
                   device=device, model_name=model, data_name=data, seed=seed, data_seed=data_seed)
    typer.echo(f"wrote {path / 'manifest.json'}", err=True)
    typer.echo(f"finding: {capture_headline(read_manifest(path), path)}")
