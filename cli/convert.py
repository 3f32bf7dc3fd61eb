"""`simkit convert`: Network of Theseus — turn a guide network into a target architecture, stage by stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
from simkit.settings.convert import ConvertSettings

# the options that name files, and what they are (checked and fingerprinted in inputs.json)
INPUT_FILES = {"guide": "model", "data": "data", "plan": "plan", "weights": "path", "align_data": "data"}
HELP = ("Convert GUIDE into a target architecture (Network of Theseus): each replaced module is aligned to the "
        "guide's representation (1 − CKA, 1 − unbiased CKA or D-MNN) stage by stage, then the target is fine-tuned "
        "on the task (head first, then everything). Baselines (scratch, logit distillation) run in the same run "
        "with the fine-tuning recipe for at least the conversion's number of optimizer steps, the best epoch on a "
        "validation split carved from the training data kept, so they usually cost more than the conversion. "
        "--schedule, --metric and --guide-init take comma lists: runs.csv gets one row per combination. Writes "
        "result.json, runs.csv, stages.csv and report.html to --out.")


@command("convert", settings=ConvertSettings, help=HELP)
def convert_command(
    guide: Annotated[str, typer.Argument(help="Guide model spec, e.g. simkit:cnn1d or file:guide.safetensors.")],
    out: OutOpt, settings: ConvertSettings, data: DataOpt = "mnist1d",
    weights: Annotated[Path | None, typer.Option("--weights", help="Local weights file for GUIDE.")] = None,
    data_seed: DataSeedOpt = 0, trust: TrustOpt = False, device: DeviceOpt = "cpu", resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit convert`: convert GUIDE into a target architecture (plus baselines), into --out."""
    from simkit.conversion import convert, load_plan_file
    from simkit.data import load_data
    from simkit.models import seeded_model_factory

    run_dir = cli_run_dir("convert", out, resume, {**settings.to_dict(), "guide": guide, "data": data,
                                                   "weights": weights, "data_seed": data_seed}, files=INPUT_FILES)
    guides = seeded_model_factory(guide, seed=settings.seed, trust=trust, weights=str(weights) if weights else None)
    first = guides(settings.seed)  # each further seed builds GUIDE with its own seed
    dataset = load_data(data, n=settings.n, seed=data_seed).with_test_split(data_seed)  # held out by the data seed
    plan = load_plan_file(settings.plan, first) if settings.plan else None
    extra = load_data(settings.align_data, seed=data_seed) if settings.align_data else None
    result = convert(guides if settings.seeds > 1 else first, dataset, settings, plan=plan, run_dir=run_dir,
                     resume=resume, device=device, guide_name=guide, data_name=data, align_data=extra)
    _echo(result)
    finish(result, out, no_report)


def _echo(result) -> None:
    """One line per arm and seed, then the headline: converted − scratch paired by seed with its interval."""
    from simkit.stats import interval_of

    score = result.extra["score"]
    for _, row in result.tables["runs"].iterrows():
        typer.echo(f"seed {row['seed']} {row['schedule']} {row['metric']} {row['guide_init']} rank {row['rank']}: "
                   f"converted {score} {row[f'converted_{score}']:.4g} (guide {row[f'guide_{score}']:.4g})")
    summary = result.summary
    if summary.get("gain_over_scratch") is not None:
        gain = interval_of(summary, "gain_over_scratch", len(summary["seeds"]))
        noise = "beyond noise" if summary["gain_beyond_noise"] else "not beyond noise"
        typer.echo(f"scratch {score} {summary[f'scratch_{score}']:.4g} after {summary['scratch_steps']} steps "
                   f"(conversion {summary['converted_steps']}): gain over scratch {gain.text(digits=4)}"
                   + (f", {noise}" if gain.n > 1 else ""))

