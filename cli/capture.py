"""`simkit capture`: write a model's layer activations once, to compare later without the model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
    DataOpt,
    DataSeedOpt,
    DeviceOpt,
    DtypeOpt,
    NOpt,
    SeedOpt,
    TrustOpt,
    command,
    load_cli_model,
)
from simkit.errors import SimkitError
from simkit.settings.compare import REDUCTIONS

#: the names of the reductions in words ("auto, flatten, ... or last"), from the one tuple
_REDUCTION_WORDS = f"{', '.join(REDUCTIONS[:-1])} or {REDUCTIONS[-1]}"
ReduceOpt = Annotated[str, typer.Option("--reduce", help=f"How a layer's output becomes a vector per sample: "
                                        f"{_REDUCTION_WORDS}; auto = the mask-aware mean over the tokens of a "
                                        "sequence, flatten for everything else.")]


@command("capture", arg_flags={"acts": "from_file"}, help=(
    "Run MODEL over the data once and write the chosen layers' activations to --out as safetensors "
    "shards plus manifest.json, or import activations from a file with --from FILE. Compare two caches with "
    "`simkit compare DIR_A DIR_B`, or three or more for a model × model study."))
def capture_command(
    out: Annotated[Path, typer.Option("--out", help="Cache directory to write.")],
    model: Annotated[str | None, typer.Argument(help="Model spec, e.g. torchvision:resnet18 (none with --from).",
                                                show_default=False)] = None,
    from_file: Annotated[Path | None, typer.Option("--from", help=(
        "Import activations from this file instead of running a model: .npy, .npz, .safetensors, .pt, .h5, or a "
        "directory of .npy files (an `ids` entry keeps the sample IDs)."), show_default=False)] = None,
    data: DataOpt = "synthetic:3x64x64",
    n: NOpt = None,
    layers: Annotated[str, typer.Option("--layers", help="Names, globs, type:Class, presets (blocks).")] = "blocks",
    reduce: ReduceOpt = "auto",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per forward pass.")] = 64,
    weights: Annotated[Path | None, typer.Option("--weights", help="Local weights file.")] = None,
    seed: SeedOpt = 0,
    data_seed: DataSeedOpt = 0,
    dtype: DtypeOpt = None,
    device: DeviceOpt = "cpu",
    trust: TrustOpt = False,
) -> None:
    """`simkit capture`: run MODEL over the data once (or import --from FILE) and cache the activations in --out."""
    from simkit.engine import capture, capture_arrays
    from simkit.engine.loading import data_for
    from simkit.report.headline import capture_headline, read_manifest

    if (model is None) == (from_file is None):
        raise SimkitError("give a MODEL to run, or activations to import with --from FILE (not both)")
    if from_file is not None:
        path = capture_arrays(from_file, out, layers=layers, reduce=reduce, batch_size=batch_size, n=n, trust=trust)
    else:
        dataset = data_for(data, str(model), n=n, seed=data_seed)
        module = load_cli_model(str(model), seed=seed, trust=trust, weights=weights, dtype=dtype)
        path = capture(module, dataset, out, layers=layers, reduce=reduce, batch_size=batch_size, n=n,
                       device=device, model_name=str(model), data_name=data, seed=seed, data_seed=data_seed)
    typer.echo(f"wrote {path / 'manifest.json'}", err=True)
    typer.echo(f"finding: {capture_headline(read_manifest(path), path)}")
