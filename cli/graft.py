"""`simkit graft`: the exact-surgery verification suite (E1, E2, E3, F3) on a model."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
    FLAG,
    DataSeedOpt,
    NOpt,
    NoReportOpt,
    OutOpt,
    ResumeOpt,
    SeedOpt,
    TrustOpt,
    command,
    finish,
    load_cli_model,
)
from simkit.cli.inputs import cli_run_dir


class Branch(str, Enum):
    mlp = "mlp"
    llama = "llama"
    conv = "conv"


class Gate(str, Enum):
    shadow = "shadow"
    net2net = "net2net"
    double_zero = "double_zero"


@command("graft", help=(
    "Graft a gated residual block F(x) = x + a*R(x) after module --after and verify the exact-surgery "
    "paper's checks: E1 bit mismatches, E2 shadow/net2net/double-zero gradients, E3 recompute cost vs "
    "downstream cone, F3 bit-identical resume after a SIGKILL; ends with one line: which checks pass.\n\n"
    "Without MODEL it runs on the built-in 4-block Llama-style model (d=128, 4 heads, vocabulary 50) "
    "and seeded Markov-chain token sequences. On a user's model the loss is cross-entropy when --data "
    "has labels, otherwise mean squared error to a fixed random target (recorded as loss_kind)."))
def graft_command(
    out: OutOpt,
    model: Annotated[str | None, typer.Argument(help="Model spec (default: simkit:llama).")] = None,
    after: Annotated[str | None, typer.Option("--after", help="Module whose output gets the graft "
                                              "(default for the built-in model: blocks.1).")] = None,
    branch: Annotated[Branch | None, typer.Option("--branch", help="Residual branch R (default: llama for "
                                                  "the built-in model, mlp otherwise).")] = None,
    gate: Annotated[Gate, typer.Option("--gate", help="shadow (a=0, random R) or net2net (a=1, zero output "
                                       "projections); double_zero needs --allow-double-zero.")] = Gate.shadow,
    data: Annotated[str | None, typer.Option("--data", help="Data spec (required with MODEL; default for "
                                             "the built-in model: seeded random token sequences).")] = None,
    n: NOpt = None,
    steps: Annotated[int, typer.Option("--steps", help="Training steps of each E2 arm and of F3.")] = 600,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per training batch.")] = 16,
    allow_double_zero: Annotated[bool, typer.Option(
        "--allow-double-zero", help="Allow the double-zero gate (only to demonstrate that nothing trains).",
        metavar=FLAG)] = False,
    weights: Annotated[Path | None, typer.Option(
        "--weights", help="Local weights file for MODEL (or for the built-in model).")] = None,
    seed: SeedOpt = 0,
    data_seed: DataSeedOpt = 0,
    trust: TrustOpt = False,
    resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit graft`: graft a gated residual block after --after, run the E1-E3 and F3 checks, into --out."""
    from simkit.data import load_data
    from simkit.grafting import BUILTIN, GraftSettings, graft
    from simkit.grafting.tasks import is_builtin

    settings = GraftSettings(model=model or BUILTIN, data=data, n=n, seed=seed, after=after,
                             branch=branch.value if branch else None, gate=gate.value, steps=steps,
                             batch_size=batch_size, allow_double_zero=allow_double_zero).validate()
    module = load_cli_model(settings.model or BUILTIN, seed=seed, trust=trust, weights=weights)
    builtin = is_builtin(module)
    settings.resolved(builtin)  # a MODEL needs --after: known before its data is read
    dataset = None if data is None else load_data(data, n=settings.samples(builtin), seed=data_seed)
    run_dir = cli_run_dir("graft", out, resume, {**settings.to_dict(), "weights": weights, "data_seed": data_seed},
                          files={"model": "model", "data": "data", "weights": "path"})
    result = graft(module, dataset, settings, run_dir=run_dir, resume=resume)
    finish(result, Path(out), no_report)
    typer.echo(f"graft: {result.summary['verdict']}")
