"""`simkit linearize` (post-training linearization sweep) and `simkit napl` (path-length statistics)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
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
from simkit.cli.inputs import check_inputs


@command("linearize", help=(
    "Post-training linearization: swap every ReLU of a trained MODEL for a learnable slope α (starting "
    "at 0, so the network is unchanged), post-train with cross-entropy + ω·Σ(|1−α|+ε)^0.5 for each ω and "
    "granularity, freeze α = 1 once reached, and report accuracy against NAPL (normalised average path "
    "length), path-length histograms and per-layer nonlinear fractions. Writes runs.csv, layers.csv, "
    "result.json and report.html to --out."))
def linearize_command(
    model: Annotated[str, typer.Argument(help="Model spec of a trained ReLU network (file:PATH, simkit:cnn1d, ...).")],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write (created if missing).")],
    data: Annotated[str, typer.Option("--data", help="Labelled data spec: mnist1d, digits, npy:PATH, ...")] = "mnist1d",
    granularity: Annotated[list[str] | None, typer.Option(
        "--granularity", help="channel, layer or both (comma list).")] = None,
    omega: Annotated[list[str] | None, typer.Option(
        "--omega", help="Penalty weights ω (comma list), e.g. 1e-4,1e-3,1e-2,1e-1.")] = None,
    epochs: Annotated[float, typer.Option("--epochs", help="Post-training epochs per run.")] = 5.0,
    train: Annotated[float, typer.Option("--train", help="Train MODEL for this many epochs first (demo).")] = 0.0,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate of the weights.")] = 1e-3,
    slope_lr: Annotated[float, typer.Option("--slope-lr", help="Learning rate of the slopes α.")] = 1e-2,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per training batch.")] = 128,
    fold: Annotated[bool, typer.Option("--fold", help="Fold fully linear stretches; report depth and size.")] = False,
    cka: Annotated[bool, typer.Option("--cka/--no-cka", help="CKA of each run against the original.")] = True,
    weights: WeightsOpt = None,
    n: NOpt = None,
    seed: SeedOpt = 0,
    trust: TrustOpt = False,
    device: DeviceOpt = "cpu",
    resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    from simkit.data import load_data
    from simkit.linearization.runner import run_linearization

    granularities = split_list(granularity) or ["channel", "layer"]
    omegas = split_floats(omega, "--omega") or [1e-4, 1e-3, 1e-2, 1e-1]
    check_inputs("linearize", out, resume, dict(
        model=model, data=data, granularity=granularities, omega=omegas, epochs=epochs, train=train, lr=lr,
        slope_lr=slope_lr, batch_size=batch_size, fold=fold, cka=cka, weights=weights, n=n, seed=seed),
        files={"model": "model", "data": "data", "weights": "path"})
    dataset = load_data(data, n=n, seed=seed)
    net = load_cli_model(model, seed=seed, trust=trust, weights=weights)
    result = run_linearization(net, dataset, granularities=granularities, omegas=omegas, epochs=epochs,
                               lr=lr, slope_lr=slope_lr, batch_size=batch_size, fold=fold, cka=cka,
                               train_epochs=train, seed=seed, run_dir=out, resume=resume, progress=True,
                               model_spec=model, data_spec=data, device=device)
    finish(result, out, no_report)


@command("napl", help=(
    "Print a network's NAPL (expected number of nonlinear units on an input-to-output path, merges "
    "averaging their branches) and its path-length distribution, without training. --json prints "
    '{"napl": ..., "distribution": [P(0), P(1), ...], "apl": ..., ...}.'))
def napl_command(
    model: Annotated[str, typer.Argument(help="Model spec (torchvision:resnet18, simkit:cnn1d, file:PATH, ...).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    data: Annotated[str | None, typer.Option(
        "--data", help="Optional data spec: one sample is run to tell tensors from shape values.")] = None,
    weights: WeightsOpt = None,
    seed: SeedOpt = 0,
    trust: TrustOpt = False,
) -> None:
    from simkit.linearization.napl import path_lengths

    net = load_cli_model(model, seed=seed, trust=trust, weights=weights)
    example = None
    if data is not None:
        from simkit.data import load_data

        dataset = load_data(data, n=2, seed=seed)
        example = dataset.inputs
    stats = path_lengths(net, example)
    if as_json:
        typer.echo(json.dumps(stats.to_dict(), allow_nan=False))
        return
    typer.echo(f"NAPL {stats.napl:.6g}   APL (unnormalised) {stats.apl:.6g}   "
               f"paths {stats.num_paths:.6g}   activations {len(stats.activations)}")
    typer.echo("length  P(normalised)  P(unnormalised)")
    for k, (p, q) in enumerate(zip(stats.distribution, stats.apl_distribution, strict=False)):
        typer.echo(f"{k:6d}  {p:13.6g}  {q:15.6g}")
