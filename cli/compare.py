"""`simkit compare`: two models (or two activation caches, or a list of caches) → similarity report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from simkit.cli.common import (
    LIST,
    DataSeedOpt,
    DeviceOpt,
    DtypeOpt,
    NoReportOpt,
    TrustOpt,
    command,
    finish,
    split_list,
)
from simkit.errors import SimkitError
from simkit.settings.compare import REDUCTIONS, CompareSettings

if TYPE_CHECKING:
    from simkit.results import CompareResult, StudyResult

HELP = ("Compare every chosen layer of model A with every chosen layer of model B.\n\n"
        "MODELS are two model specs (torchvision:resnet18, timm:NAME, hf:DIR, file:PATH, python:pkg.mod:fn, "
        "simkit:cnn1d), two cache directories written by `simkit capture`, two activation files (.npy, .npz, "
        ".safetensors, .pt, .h5, or a directory of .npy files), or three or more caches or files for a model × "
        "model study. Writes similarity.csv, result.json and report.html to --out.")


def _per_model(kind: type, help: str, side: str, **extra) -> object:
    """The option of model ``side`` (A or B) whose help is ``help`` with {side} filled in."""
    return Annotated[kind, typer.Option(help=help.format(side=side), **extra)]


_LAYERS, _NAME = "Layers of {side}: names, globs, type:Class, blocks.", \
    "Name of {side} in the report and summary (default: its spec or the cache's model)."
LayersA, LayersB = (_per_model(str, _LAYERS, side) for side in "AB")
NameA, NameB = (_per_model(str | None, _NAME, side, show_default=False) for side in "AB")  # type: ignore[arg-type]
WeightsA, WeightsB = (_per_model(Path | None, "Local weights file for {side}.", side) for side in "AB")  # type: ignore[arg-type]
ReduceOpt = Annotated[Literal[REDUCTIONS], typer.Option(  # type: ignore[valid-type]
    help="How a layer's output becomes a vector per sample: auto = the mask-aware mean over the tokens of a "
    "sequence, flatten for everything else.")]
PairingOpt = Annotated[str, typer.Option(
    help="Study of three or more caches: each cache's layer. last, first, depth[:F] (the layer at relative depth F "
    "of each cache's layers, 0 = first, 1 = last; default 0.5), a name for all, one per cache (A,B,C), or names of "
    "one layer across architectures (LAYER_A=LAYER_B: each cache uses the one it holds).")]
NamesOpt = Annotated[list[str] | None, typer.Option(
    metavar=LIST, help="Study of caches: one name per cache, in order (default: the cache folders' names).",
    show_default=False)]
IdsA, IdsB = (_per_model(Path | None, "Sample IDs of {side}'s activations: a file with one ID per line, or a CSV "  # type: ignore[arg-type]
                          "(--ids-column); with IDs on both sides the samples present in both are compared.", side,
                          show_default=False) for side in "AB")
IdsColumnOpt = Annotated[str | None, typer.Option(help="The column of --ids-a/--ids-b CSV files that holds the IDs.",
                                                  show_default=False)]
OutputIndexOpt = Annotated[str | None, typer.Option(
    help="For tuple/dict outputs: which element to capture (index or key).")]


@command("compare", arg_flags={"metrics": "metric", "paths": "models", "acts_a": "models", "acts_b": "models"},
         settings=CompareSettings, help=HELP)
def compare_command(
    models: Annotated[list[str], typer.Argument(help="Two model specs, or two or more caches or activation files.")],
    out: Annotated[Path, typer.Option(help="Run directory to write (created if missing).")],
    settings: CompareSettings,
    data: Annotated[str | None, typer.Option(help="Data spec (needed for models, not caches).")] = None,
    layers_a: LayersA = "blocks", layers_b: LayersB = "blocks", reduce: ReduceOpt = "auto",  # type: ignore[valid-type]
    pairing: PairingOpt = "last", output_index: OutputIndexOpt = None,
    weights_a: WeightsA = None, weights_b: WeightsB = None,  # type: ignore[valid-type]
    name_a: NameA = None, name_b: NameB = None, names: NamesOpt = None,  # type: ignore[valid-type]
    ids_a: IdsA = None, ids_b: IdsB = None, ids_column: IdsColumnOpt = None, dtype: DtypeOpt = None,  # type: ignore[valid-type]
    data_seed: DataSeedOpt = 0, device: DeviceOpt = "cpu", trust: TrustOpt = False, no_report: NoReportOpt = False,
) -> None:
    """`simkit compare`: similarity of two models' layers (or of caches or activation files, or a study), into --out."""
    from simkit.engine import compare, compare_arrays, compare_caches, study
    from simkit.engine.loading import classify_sources, load_pair

    kind = classify_sources(models)
    pair_names = _pair_names(models, kind, name_a, name_b, names)
    ids = _sample_ids(kind, models, (ids_a, ids_b), ids_column, dtype)
    result: CompareResult | StudyResult
    if kind != "models" and len(models) > 2:
        result = study(models, settings, pairing=pairing, device=device, names=split_list(names) or None)
    elif kind == "arrays":
        result = compare_arrays(models[0], models[1], settings, ids_a=ids[0], ids_b=ids[1], layers_a=layers_a,
                                layers_b=layers_b, reduce=reduce, device=device, names=pair_names, trust=trust)
    elif kind == "caches":
        result = compare_caches(models[0], models[1], settings, layers_a=layers_a, layers_b=layers_b,
                                device=device, names=pair_names)
    else:
        pair = load_pair(models[0], models[1], _required_data(data), seed=settings.seed, data_seed=data_seed, n=settings.n,
                         trust=trust, weights_a=weights_a, weights_b=weights_b, dtype=dtype)
        result = compare(pair.model_a, pair.model_b, pair.data, settings, layers_a=layers_a, layers_b=layers_b,
                         reduce=reduce, device=device, output_index=_index(output_index),
                         names=pair_names or (models[0], models[1]), data_name=data, data_b=pair.data_b)
    finish(result, out, no_report)


def _sample_ids(kind: str, models: list[str], files: tuple[Path | None, Path | None], column: str | None,
                dtype: str | None) -> list[list[str] | None]:
    """The sample IDs of --ids-a and --ids-b (one per line, or a CSV's --ids-column), for two activation
    files; --dtype belongs to models."""
    from simkit.engine.arrays import ids_from_file

    if dtype is not None and kind != "models":
        raise SimkitError("--dtype loads models in that dtype; activations and caches keep the dtype of their files")
    if any(files) and (kind != "arrays" or len(models) != 2):
        raise SimkitError("--ids-a and --ids-b give the sample IDs of two activation files; a study reads the IDs "
                          "in each file (an `ids` entry), and models and caches have none")
    if column is not None and not any(files):
        raise SimkitError("--ids-column names the ID column of the CSV files given with --ids-a and --ids-b")
    return [None if file is None else ids_from_file(file, column) for file in files]


def _required_data(data: str | None) -> str:
    if data is None:
        raise SimkitError("--data is required when comparing models, e.g. --data synthetic:3x64x64")
    return data


def _index(output_index: str | None) -> int | str | None:
    """``--output-index`` as an index when it is a whole number, else a key."""
    return int(output_index) if output_index is not None and output_index.isdigit() else output_index


def _pair_names(models: list[str], kind: str, name_a: str | None, name_b: str | None,
                names: list[str] | None) -> tuple[str, str] | None:
    """The names of A and B from --name-a/--name-b (each defaults to what names it without them), or
    None when neither is given; --names belongs to a study and --name-a/--name-b to a pair."""
    study = kind != "models" and len(models) > 2
    if study and (name_a or name_b):
        raise SimkitError("--name-a and --name-b name the two models of a comparison; name the caches of a "
                          "study with --names NAME,NAME,...")
    if names and not study:
        raise SimkitError("--names names the caches of a study (three or more); name the two models of a "
                          "comparison with --name-a and --name-b")
    if not (name_a or name_b):
        return None
    if kind == "caches":
        from simkit.engine.sources import read_manifest

        defaults = [str(read_manifest(path)["model"]) for path in models]
    else:
        defaults = models
    return name_a or defaults[0], name_b or defaults[1]
