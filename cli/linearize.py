"""`simkit linearize`: the post-training linearization sweep (``simkit.linearization.linearize``); its
sweep options are generated from ``LinearizeSettings``' declarations (``simkit.settings.linearize``)."""

from __future__ import annotations

from typing import Annotated

import typer

from simkit.cli.common import (
    DataSeedOpt,
    DeviceOpt,
    NOpt,
    NoReportOpt,
    OutOpt,
    ResumeOpt,
    TrustOpt,
    WeightsOpt,
    command,
    finish,
)
from simkit.cli.inputs import cli_run_dir
from simkit.settings.linearize import LinearizeSettings

HELP = ("Post-training linearization: swap every ReLU of a trained MODEL for a learnable slope α (starting at 0, "
        "so the network is unchanged), post-train with cross-entropy + ω·Σ(|1−α|+ε)^0.5 for each ω and granularity, "
        "freeze α = 1 once reached, and report accuracy against NAPL (normalised average path length), path-length "
        "histograms and per-layer nonlinear fractions. --seeds N repeats the sweep for seeds --seed, --seed+1, ... "
        "(each seed builds MODEL with its seed) and reports mean ± spread. --recover EPOCHS then fine-tunes every "
        "run's weights with its slopes fixed and reports accuracy before and after. Writes runs.csv, layers.csv, "
        "aggregate.csv, matched.csv, result.json and report.html to --out.")
ModelArg = Annotated[str, typer.Argument(help="Model spec of a trained ReLU network (file:PATH, simkit:cnn1d, ...).")]
LabelledDataOpt = Annotated[str, typer.Option("--data", help="Labelled data spec: mnist1d, digits, npy:PATH, ...")]


@command("linearize", settings=LinearizeSettings, help=HELP)
def linearize_command(
    model: ModelArg, out: OutOpt, settings: LinearizeSettings, data: LabelledDataOpt = "mnist1d",
    weights: WeightsOpt = None, n: NOpt = None, data_seed: DataSeedOpt = 0, trust: TrustOpt = False,
    device: DeviceOpt = "cpu", resume: ResumeOpt = False, no_report: NoReportOpt = False,
) -> None:
    """`simkit linearize`: post-train learnable ReLU slopes over the ω × granularity sweep, into --out."""
    from simkit.data import load_data
    from simkit.linearization import linearize
    from simkit.models import seeded_model_factory

    run_dir = cli_run_dir("linearize", out, resume, {**settings.to_dict(), "model": model, "data": data,
                                                       "weights": weights, "n": n, "data_seed": data_seed},
                          files={"model": "model", "data": "data", "weights": "path"})   # checked, not started

    # each seed its own initialisation (zoo specs); files load the same weights
    build = seeded_model_factory(model, seed=settings.seed, trust=trust, weights=str(weights) if weights else None)
    dataset = load_data(data, n=n, seed=data_seed).with_test_split(data_seed)  # held out by the data seed
    result = linearize(build, dataset, settings, run_dir=run_dir, resume=resume, device=device, progress=True,
                       model_name=model, data_name=data)
    finish(result, out, no_report)   # its warnings: once each, as one line (simkit.cli.common.WarningChannel)
