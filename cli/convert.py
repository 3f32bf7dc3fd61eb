"""`simkit convert`: Network of Theseus — turn a guide network into a target architecture, stage by stage."""

from __future__ import annotations

from typing import Annotated

import typer

from simkit.cli.common import (
    DataOpt,
    DeviceOpt,
    NOpt,
    NoReportOpt,
    OutOpt,
    ResumeOpt,
    SeedOpt,
    TrustOpt,
    command,
    finish,
    split_list,
)
from simkit.cli.inputs import cli_run_dir


@command("convert", help=(
    "Convert GUIDE into a target architecture (Network of Theseus): each replaced module is aligned to "
    "the guide's representation (1 − CKA, 1 − unbiased CKA or D-MNN) stage by stage, then the target is "
    "fine-tuned on the task. Baselines (scratch, logit distillation) run in the same run with the same "
    "budget. --schedule, --metric and --guide-init take comma lists: runs.csv gets one row per "
    "combination. Writes result.json, runs.csv, stages.csv and report.html to --out."))
def convert_command(
    guide: Annotated[str, typer.Argument(help="Guide model spec, e.g. simkit:cnn1d or file:guide.safetensors.")],
    out: OutOpt,
    recipe: Annotated[str, typer.Option(
        "--recipe", help="conv-to-mlp, deep-to-shallow or attention-to-rnn (ignored with --plan).")] = "conv-to-mlp",
    data: DataOpt = "mnist1d",
    schedule: Annotated[list[str] | None, typer.Option(
        "--schedule", help="progressive, sequential, independent, joint (comma list).")] = None,
    metric: Annotated[list[str] | None, typer.Option(
        "--metric", help="Alignment loss: cka, unbiased_cka, dmnn (comma list).")] = None,
    baselines: Annotated[str, typer.Option(
        "--baselines", help="Comma list of scratch, kd; 'none' for no baseline.")] = "scratch,kd",
    plan: Annotated[str | None, typer.Option(
        "--plan", help="FILE.py:FUNCTION returning a ReplacementPlan (runs that file's code).")] = None,
    rank: Annotated[int, typer.Option("--rank", help="Rank of conv-to-mlp's low-rank linear maps.")] = 256,
    group: Annotated[int, typer.Option("--group", help="deep-to-shallow: guide blocks per target block.")] = 2,
    cell: Annotated[str, typer.Option("--cell", help="attention-to-rnn: gru, lstm or rnn.")] = "gru",
    steps_per_stage: Annotated[int, typer.Option("--steps-per-stage", help="Alignment steps per stage.")] = 300,
    finetune_epochs: Annotated[float, typer.Option(
        "--finetune-epochs", help="Epochs of end-to-end fine-tuning (baselines get these plus the head epochs).")] = 60,
    head_epochs: Annotated[float | None, typer.Option(
        "--head-epochs", help="Head-only epochs before fine-tuning (default: finetune epochs / 6).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Alignment batch size (CKA depends on it).")] = 256,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate (alignment and fine-tuning).")] = 1e-3,
    guide_init: Annotated[list[str] | None, typer.Option(
        "--guide-init", help="trained (the guide as loaded/trained) or random (an untrained copy); comma list.")] = None,
    train_guide: Annotated[float, typer.Option(
        "--train-guide", help="Train the guide on the task for this many epochs first (0 = use as is).")] = 0,
    plateau_window: Annotated[int, typer.Option(
        "--plateau-window", help="Steps of the loss EMA between plateau checks (LR halves on a plateau; 0 = off).")] = 100,
    n: NOpt = None,
    seed: SeedOpt = 0,
    trust: TrustOpt = False,
    device: DeviceOpt = "cpu",
    resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    from simkit.data import load_data
    from simkit.models import load_model
    from simkit.theseus import ConvertSettings, convert, load_plan_file

    settings = ConvertSettings(
        recipe=None if plan else recipe, schedule=split_list(schedule) or ["progressive"],
        metric=split_list(metric) or ["cka"],
        baselines=[] if baselines.strip().lower() == "none" else split_list(baselines), plan=plan, rank=rank,
        group=group, cell=cell, steps_per_stage=steps_per_stage, finetune_epochs=finetune_epochs,
        head_epochs=head_epochs, batch_size=batch_size, lr=lr, guide_init=split_list(guide_init) or ["trained"],
        train_guide=train_guide, plateau_window=plateau_window, seed=seed, n=n).validate()
    run_dir = cli_run_dir("convert", out, resume, {**settings.to_dict(), "guide": guide, "data": data},
                          files={"guide": "model", "data": "data", "plan": "plan"})
    guide_model = load_model(guide, seed=seed, trust=trust)
    dataset = load_data(data, n=n, seed=seed)
    replacement_plan = load_plan_file(plan, guide_model) if plan else None
    result = convert(guide_model, dataset, settings, plan=replacement_plan, run_dir=run_dir, resume=resume,
                     device=device, guide_name=guide, data_name=data)
    score = result.extra["score"]
    for _, row in result.tables["runs"].iterrows():
        typer.echo(f"{row['schedule']} {row['metric']} {row['guide_init']}: converted {score} "
                   f"{row[f'converted_{score}']:.4g} (guide {row[f'guide_{score}']:.4g})")
    finish(result, out, no_report)
