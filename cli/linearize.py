"""`simkit linearize`: the post-training linearization sweep (``simkit.linearization.linearize``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
    FLAG,
    LIST,
    DataSeedOpt,
    DeviceOpt,
    NOpt,
    NoReportOpt,
    ResumeOpt,
    SeedOpt,
    TrustOpt,
    WeightsOpt,
    command,
    finish,
    load_cli_model,
    split_floats,
    split_list,
)
from simkit.cli.inputs import cli_run_dir


@command("linearize", help=(
    "Post-training linearization: swap every ReLU of a trained MODEL for a learnable slope α (starting "
    "at 0, so the network is unchanged), post-train with cross-entropy + ω·Σ(|1−α|+ε)^0.5 for each ω and "
    "granularity, freeze α = 1 once reached, and report accuracy against NAPL (normalised average path "
    "length), path-length histograms and per-layer nonlinear fractions. --seeds N repeats the sweep for "
    "seeds --seed, --seed+1, ... (each seed builds MODEL with its seed) and reports mean ± spread. --recover "
    "EPOCHS then fine-tunes every run's weights with its slopes fixed and reports accuracy before and after. Writes "
    "runs.csv, layers.csv, aggregate.csv, matched.csv, result.json and report.html to --out."))
def linearize_command(
    model: Annotated[str, typer.Argument(help="Model spec of a trained ReLU network (file:PATH, simkit:cnn1d, ...).")],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write (created if missing).")],
    data: Annotated[str, typer.Option("--data", help="Labelled data spec: mnist1d, digits, npy:PATH, ...")] = "mnist1d",
    granularity: Annotated[list[str] | None, typer.Option(
        "--granularity", help="channel, layer or both (comma list).", show_default="channel,layer", metavar=LIST)] = None,
    omega: Annotated[list[str] | None, typer.Option(
        "--omega", help="Penalty weights ω (comma list).",
        show_default="1e-4,1e-3,1e-2,1e-1", metavar=LIST)] = None,
    epochs: Annotated[float, typer.Option("--epochs", help="Post-training epochs per run.")] = 5.0,
    train: Annotated[float, typer.Option("--train", help="Train MODEL for this many epochs first (demo).")] = 0.0,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate of the weights.")] = 1e-3,
    slope_lr: Annotated[float, typer.Option("--slope-lr", help="Learning rate of the slopes α.")] = 1e-2,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per training batch.")] = 128,
    fold: Annotated[bool, typer.Option("--fold", help="Fold fully linear stretches; report depth and size.",
                                        metavar=FLAG)] = False,
    cka: Annotated[bool, typer.Option("--cka/--no-cka", help="CKA of each run against the original.", metavar=FLAG)] = True,
    recover: Annotated[float, typer.Option(
        "--recover", help="After post-training, fine-tune each run's weights for this many epochs with its slopes "
                          "fixed and no penalty (0: no recovery); runs.csv adds accuracy_recovered.")] = 0.0,
    weights: WeightsOpt = None,
    n: NOpt = None,
    seed: SeedOpt = 0,
    data_seed: DataSeedOpt = 0,
    seeds: Annotated[int, typer.Option(
        "--seeds", help="Number of seeds: the sweep runs for --seed, --seed+1, ... and the report shows "
                        "mean ± spread (error bars).")] = 1,
    trust: TrustOpt = False,
    device: DeviceOpt = "cpu",
    resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit linearize`: post-train learnable ReLU slopes over the ω × granularity sweep, into --out."""
    from simkit.data import load_data
    from simkit.linearization import LinearizeSettings, linearize

    defaults = LinearizeSettings()  # an empty comma list means the library's default sweep
    settings = LinearizeSettings(
        granularity=split_list(granularity) or defaults.granularity,
        omega=split_floats(omega, "--omega") or defaults.omega, epochs=epochs, train=train, lr=lr,
        slope_lr=slope_lr, batch_size=batch_size, fold=fold, cka=cka, seed=seed, seeds=seeds, recover=recover)
    settings.validate()
    run_dir = cli_run_dir("linearize", out, resume, {**settings.to_dict(), "model": model, "data": data,
                                                       "weights": weights, "n": n, "data_seed": data_seed},
                          files={"model": "model", "data": "data", "weights": "path"})   # checked, not started

    def build(model_seed: int):   # each seed its own initialisation (zoo specs); files load the same weights
        return load_cli_model(model, seed=model_seed, trust=trust, weights=weights)

    dataset = load_data(data, n=n, seed=data_seed).with_test_split(data_seed)  # held out by the data seed
    result = linearize(build, dataset, settings, run_dir=run_dir, resume=resume, device=device, progress=True,
                       model_name=model, data_name=data)
    finish(result, out, no_report)   # its warnings: once each, as one line (simkit.cli.common.WarningChannel)
