"""`simkit stitch`: standard and invariance-aware model stitching of A's front into B's back half."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simkit.cli.common import (
    DataOpt,
    DataSeedOpt,
    DeviceOpt,
    NoReportOpt,
    OutOpt,
    ResumeOpt,
    TrustOpt,
    command,
    finish,
)
from simkit.cli.inputs import cli_run_dir
from simkit.settings.stitch import StitchSettings

if TYPE_CHECKING:
    from simkit.data import Dataset

HELP = ("Stitch model A's front half into model B's back half at layer pairs and measure the stitching "
        "penalty (B's accuracy minus the stitched accuracy; penalty_min: the lower of A's and B's accuracies minus "
        "it) on the evaluation set (the test split of --data, or --test-data). With --iri the invariance-aware "
        "arm (stitches trained only on IRIs of A) runs beside the standard one; --train E trains A and B first. A "
        "model at chance and IRIs that missed their tolerance are warned about. Writes stitching.csv, result.json "
        "and report.html to --out.")
#: what inputs.json records of each local file a spec or path names
FILES = {"model_a": "model", "model_b": "model", "data": "data", "test_data": "data", "weights_a": "path",
         "weights_b": "path"}

ModelA = Annotated[str, typer.Argument(help="Front model spec (A), e.g. simkit:cnn1d or file:a.safetensors.")]
ModelB = Annotated[str, typer.Argument(help="Back model spec (B).")]
TestDataOpt = Annotated[str | None, typer.Option(
    "--test-data", help="Evaluation data spec of its own (its test split if it has one, else all of it); "
    "all of --data then trains the stitches. Default: the test split of --data.", show_default=False)]
CacheDirOpt = Annotated[Path | None, typer.Option(
    "--cache-dir", help="IRI cache directory (default: runs/.iri-cache).", show_default=False)]
WeightsA, WeightsB = (Annotated[Path | None, typer.Option(
    f"--weights-{side.lower()}", help=f"Local weights file for {side} (every seed loads it).")] for side in "AB")
NameA, NameB = (Annotated[str | None, typer.Option(
    f"--name-{side.lower()}", help=f"Name of {side} in the report and summary (default: its spec).",
    show_default=False)] for side in "AB")


@command("stitch", settings=StitchSettings, help=HELP)
def stitch_command(
    model_a: ModelA, model_b: ModelB, out: OutOpt, settings: StitchSettings, data: DataOpt = "mnist1d",
    test_data: TestDataOpt = None, cache_dir: CacheDirOpt = None,
    weights_a: WeightsA = None, weights_b: WeightsB = None,  # type: ignore[valid-type]
    name_a: NameA = None, name_b: NameB = None,  # type: ignore[valid-type]
    data_seed: DataSeedOpt = 0, device: DeviceOpt = "cpu", trust: TrustOpt = False, resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit stitch`: stitch A's front into B's back at layer pairs, measure the penalty, into --out."""
    from simkit.models import seeded_model_factory
    from simkit.stitching import runner

    run_dir = cli_run_dir("stitch", out, resume, {
        **settings.to_dict(), "model_a": model_a, "model_b": model_b, "data": data, "test_data": test_data,
        "data_seed": data_seed, "weights_a": weights_a, "weights_b": weights_b}, files=FILES)  # checked, not started
    # A gets the seed, B seed + 1 (simkit.seeding.pair_seeds): the same spec twice gives two networks
    build_a, build_b = (seeded_model_factory(spec, seed=settings.seed, trust=trust, side=side,
                                             weights=str(weights) if weights else None)
                        for spec, side, weights in ((model_a, "model_a", weights_a), (model_b, "model_b", weights_b)))
    dataset, evaluation = stitch_data(data, test_data, settings.n, data_seed)
    result = runner.stitch(build_a, build_b, dataset, settings, test_data=evaluation, run_dir=run_dir,
                           resume=resume, device=device, cache_dir=cache_dir or runner.DEFAULT_CACHE,
                           names=(name_a or model_a, name_b or model_b))
    finish(result, out, no_report)   # its warnings: once each, as one line (simkit.cli.common.WarningChannel)


def stitch_data(data: str, test_data: str | None, n: int | None, data_seed: int) -> tuple[Dataset, Dataset | None]:
    """(the stitching data, the evaluation set or None): ``data`` with its test split held out by the data
    seed, unless ``test_data`` evaluates (then all of ``data`` trains and ``test_data`` is the evaluation set)."""
    from simkit.data import load_data

    dataset = load_data(data, n=n, seed=data_seed)
    if test_data is None:
        return dataset.with_test_split(data_seed), None
    return dataset, load_data(test_data, seed=data_seed)
