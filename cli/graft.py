"""`simkit graft`: the exact-surgery verification suite (E1, E2, E3, F3) on a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
    DataSeedOpt,
    NoReportOpt,
    OutOpt,
    ResumeOpt,
    TrustOpt,
    command,
    finish,
    load_cli_model,
)
from simkit.cli.inputs import cli_run_dir
from simkit.settings.graft import BUILTIN, GraftSettings

HELP = ("Graft a gated residual block F(x) = x + a*R(x) after module --after and verify the exact-surgery "
        "paper's checks: E1 bit mismatches, E2 shadow/net2net/double-zero gradients, E3 recompute cost vs "
        "downstream cone, F3 bit-identical resume after a SIGKILL; ends with one line: which checks pass.\n\n"
        "Without MODEL it runs on the built-in 4-block Llama-style model (d=128, 4 heads, vocabulary 50) "
        "and seeded Markov-chain token sequences. On a user's model the loss is cross-entropy when --data "
        "has labels, otherwise mean squared error to a fixed random target (recorded as loss_kind).")
#: the settings field `model` as the command's argument (@command also puts its value into `settings.model`)
ModelArg = Annotated[str | None, typer.Argument(help="Model spec (default: simkit:llama).")]
WeightsOpt = Annotated[Path | None, typer.Option(help="Local weights file for MODEL (or for the built-in model).")]


@command("graft", settings=GraftSettings, help=HELP)
def graft_command(out: OutOpt, settings: GraftSettings, model: ModelArg = None, weights: WeightsOpt = None,
                  data_seed: DataSeedOpt = 0, trust: TrustOpt = False, resume: ResumeOpt = False,
                  no_report: NoReportOpt = False) -> None:
    """`simkit graft`: graft a gated residual block after --after, run the E1-E3 and F3 checks, into --out."""
    from simkit.data import load_data
    from simkit.grafting import graft
    from simkit.grafting.tasks import is_builtin

    settings = settings.updated(model=settings.model or BUILTIN).validate()  # no MODEL: the built-in, by name
    module = load_cli_model(str(settings.model), seed=settings.seed, trust=trust, weights=weights)
    builtin = is_builtin(module)
    settings.resolved(builtin)  # a MODEL needs --after: known before its data is read
    dataset = None if settings.data is None else load_data(settings.data, n=settings.samples(builtin),
                                                           seed=data_seed)
    run_dir = cli_run_dir("graft", out, resume, {**settings.to_dict(), "weights": weights, "data_seed": data_seed},
                          files={"model": "model", "data": "data", "weights": "path"})
    result = graft(module, dataset, settings, run_dir=run_dir, resume=resume)
    finish(result, Path(out), no_report)
    typer.echo(f"graft: {result.summary['verdict']}")
