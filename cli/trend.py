"""`simkit trend`: every checkpoint of a training run against a reference, layer by layer
(``simkit.monitor.trend``); its options are generated from ``TrendSettings``' declarations."""

from __future__ import annotations

from typing import Annotated

import typer

from simkit.cli.common import (
    DataSeedOpt,
    DeviceOpt,
    NoReportOpt,
    OutOpt,
    ResumeOpt,
    TrustOpt,
    command,
    finish,
    load_cli_model,
)
from simkit.cli.inputs import cli_run_dir
from simkit.settings.monitor import TREND_REFERENCES, TrendSettings

HELP = ("Similarity over training from saved checkpoints: each chosen layer of every checkpoint against the "
        "reference (the final checkpoint, the first, or a model spec) on the first --n samples of --data, one "
        "checkpoint loaded at a time, with chance levels. A checkpoint's step is the last number in its file name. "
        "Writes steps.csv, convergence.csv (the step from which each layer stays within --delta of its final "
        "value), result.json, report.html and figures/ to --out; --resume continues a killed run.")
CheckpointsArg = Annotated[str, typer.Argument(help="A folder of checkpoints (.pt, .pth, .ckpt, .bin, .safetensors) "
                                               "or a glob such as 'runs/ckpt/step_*.pt'.")]
ArchOpt = Annotated[str | None, typer.Option(help="Architecture spec of state-dict checkpoints (simkit:cnn1d, "
                                             "torchvision:resnet18, ...); not needed for save_model's .safetensors.")]
DataOpt = Annotated[str, typer.Option(help="Data spec of the probe set: mnist1d, digits, npy:PATH, ...")]
LayersOpt = Annotated[str, typer.Option(help="Layers: names, globs, type:Class, blocks.")]
ReferenceLayersOpt = Annotated[str | None, typer.Option(help="Layers of a reference model spec (default: --layers).")]


@command("trend", settings=TrendSettings, help=HELP)
def trend_command(
    checkpoints: CheckpointsArg, out: OutOpt, settings: TrendSettings, data: DataOpt = "mnist1d",
    arch: ArchOpt = None, layers: LayersOpt = "blocks", reference_layers: ReferenceLayersOpt = None,
    data_seed: DataSeedOpt = 0, trust: TrustOpt = False, device: DeviceOpt = "cpu", resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit trend`: a checkpoint series against its reference, into --out."""
    from simkit.data import load_data
    from simkit.monitor import trend

    run_dir = cli_run_dir("trend", out, resume, {**settings.to_dict(), "checkpoints": checkpoints, "data": data,
                                                   "arch": arch, "layers": layers, "reference_layers": reference_layers,
                                                   "data_seed": data_seed},
                          files={"checkpoints": "path", "data": "data", "arch": "model", "reference": "model"})
    reference = None if settings.reference in TREND_REFERENCES else \
        load_cli_model(settings.reference, seed=settings.seed, trust=trust, weights=None)
    result = trend(checkpoints, load_data(data, n=settings.n, seed=data_seed), settings, arch=arch,
                   reference_model=reference, layers=layers, reference_layers=reference_layers, run_dir=run_dir,
                   resume=resume, device=device, trust=trust, data_name=data)
    finish(result, out, no_report)
    if not no_report:
        result.savefig(out / "figures", formats=("png", "svg"))
