"""`simkit napl`: a network's NAPL and path-length distribution, without training
(``simkit.linearization.path_lengths``)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from simkit.cli.common import FLAG, SeedOpt, TrustOpt, WeightsOpt, command, load_cli_model


@command("napl", help=(
    "Print a network's NAPL (expected number of nonlinear units on an input-to-output path, merges "
    "averaging their branches) and its path-length distribution, without training. --json prints "
    '{"napl": ..., "distribution": [P(0), P(1), ...], "apl": ..., ...}.'))
def napl_command(
    model: Annotated[str, typer.Argument(help="Model spec (torchvision:resnet18, simkit:cnn1d, file:PATH, ...).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.", metavar=FLAG)] = False,
    data: Annotated[str | None, typer.Option(
        "--data", help="Optional data spec: one sample is run to tell tensors from shape values.")] = None,
    weights: WeightsOpt = None,
    seed: SeedOpt = 0,
    trust: TrustOpt = False,
) -> None:
    """`simkit napl`: print MODEL's NAPL and path-length distribution (a table, or JSON with --json)."""
    from simkit.data import load_data
    from simkit.linearization import path_lengths

    net = load_cli_model(model, seed=seed, trust=trust, weights=weights)
    example = load_data(data, n=2, seed=seed).inputs if data is not None else None
    stats = path_lengths(net, example)
    if as_json:
        typer.echo(json.dumps(stats.to_dict(), allow_nan=False))
        return
    typer.echo(f"NAPL {stats.napl:.6g}   APL (unnormalised) {stats.apl:.6g}   "
               f"paths {stats.num_paths:.6g}   activations {len(stats.activations)}")
    typer.echo("length  P(normalised)  P(unnormalised)")
    for k, (p, q) in enumerate(zip(stats.distribution, stats.apl_distribution, strict=False)):
        typer.echo(f"{k:6d}  {p:13.6g}  {q:15.6g}")
