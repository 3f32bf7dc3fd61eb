"""`simkit convert`: Network of Theseus — turn a guide network into a target architecture, stage by stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
    FLAG,
    LIST,
    DataOpt,
    DataSeedOpt,
    DeviceOpt,
    NOpt,
    NoReportOpt,
    OutOpt,
    ResumeOpt,
    SeedOpt,
    TrustOpt,
    command,
    finish,
    load_cli_model,
    split_list,
)
from simkit.cli.inputs import cli_run_dir

# the options that name files, and what they are (checked and fingerprinted in inputs.json)
INPUT_FILES = {"guide": "model", "data": "data", "plan": "plan", "weights": "path", "align_data": "data"}
# the options of issue 23 (seeds, distillation, alignment inputs), declared once here
SeedsOpt = Annotated[int, typer.Option(
    "--seeds", help="Number of seeds: everything (guide training, every arm and baseline) runs for --seed, "
                    "--seed+1, ... (each seed builds GUIDE with its seed); aggregate.csv and the report give "
                    "mean, std and 95 % t interval, and converted − scratch paired by seed.")]
KdAlphaOpt = Annotated[float, typer.Option(
    "--kd-alpha", help="Distillation baseline: weight of the cross-entropy on the labels, alpha·CE + "
                       "(1 − alpha)·T²·KL to the guide (0 = label-free distillation).")]
KdTemperatureOpt = Annotated[float, typer.Option(
    "--kd-temperature", help="Distillation baseline: temperature T of the KL term.")]
AlignValOpt = Annotated[bool, typer.Option(
    "--align-val/--no-align-val", help="Add the validation split's inputs (never its labels) to the alignment "
                                       "inputs.", metavar=FLAG)]
BaselineBudgetOpt = Annotated[str, typer.Option(
    "--baseline-budget", help="What the baselines' optimizer steps match: steps = the conversion's total (alignment "
                              "+ head + fine-tuning; more labelled epochs than the converted arm), labelled = its "
                              "head + fine-tuning (the same labelled-training epochs).")]
AlignDataOpt = Annotated[str | None, typer.Option(
    "--align-data", help="A second data spec whose inputs (never its labels) are added to the alignment inputs; "
                         "shaped like --data.")]


@command("convert", help=(
    "Convert GUIDE into a target architecture (Network of Theseus): each replaced module is aligned to "
    "the guide's representation (1 − CKA, 1 − unbiased CKA or D-MNN) stage by stage, then the target is "
    "fine-tuned on the task (head first, then everything). Baselines (scratch, logit distillation) run in the "
    "same run with the fine-tuning recipe for at least the conversion's number of optimizer steps, the best epoch "
    "on a validation split carved from the training data kept, so they usually cost more than the conversion. "
    "--schedule, --metric and --guide-init take comma lists: runs.csv gets one row per "
    "combination. Writes result.json, runs.csv, stages.csv and report.html to --out."))
def convert_command(
    guide: Annotated[str, typer.Argument(help="Guide model spec, e.g. simkit:cnn1d or file:guide.safetensors.")],
    out: OutOpt,
    recipe: Annotated[str, typer.Option(
        "--recipe", help="conv-to-mlp, deep-to-shallow, attention-to-rnn or attention-to-mlp (ignored with --plan).")] = "conv-to-mlp",
    data: DataOpt = "mnist1d",
    schedule: Annotated[list[str] | None, typer.Option(
        "--schedule", help="progressive, sequential, independent, joint (comma list).", show_default="progressive",
        metavar=LIST)] = None,
    metric: Annotated[list[str] | None, typer.Option(
        "--metric", help="Alignment loss: linear_cka (1 − linear CKA; alias cka), unbiased_cka, dmnn (comma list).",
        show_default="linear_cka", metavar=LIST)] = None,
    baselines: Annotated[str, typer.Option(
        "--baselines", help="Comma list of scratch, kd; 'none' for no baseline.")] = "scratch,kd",
    plan: Annotated[str | None, typer.Option(
        "--plan", help="FILE.py:FUNCTION returning a ReplacementPlan (runs that file's code).")] = None,
    rank: Annotated[str, typer.Option(
        "--rank", help="Rank of conv-to-mlp's low-rank linear maps; a comma list (64,256,1024) is a rank sweep "
                       "(one arm per rank; baselines use the first).")] = "256",
    group: Annotated[int, typer.Option("--group", help="deep-to-shallow: guide blocks per target block.")] = 2,
    cell: Annotated[str, typer.Option("--cell", help="attention-to-rnn: gru, lstm or rnn.")] = "gru",
    steps_per_stage: Annotated[str, typer.Option(
        "--steps-per-stage", help="'auto': a stage ends when the EMA of its alignment loss is below --stop-loss or "
                                  "at --max-stage-steps (the LR anneals on plateaus); or a fixed number of steps per "
                                  "stage (joint: times the number of replaced modules).")] = "auto",
    max_stage_steps: Annotated[int, typer.Option(
        "--max-stage-steps", help="Step cap of one automatic stage (joint: times the number of modules).")] = 1000,
    stop_loss: Annotated[str, typer.Option(
        "--stop-loss", help="End a stage when the EMA of its loss falls below this; 'auto' = 0.002 with "
                            "--steps-per-stage auto and off with a fixed number; 'none' = off.")] = "auto",
    finetune_epochs: Annotated[float, typer.Option(
        "--finetune-epochs", help="Epochs of end-to-end fine-tuning (baselines get these plus the head epochs).")] = 60,
    head_epochs: Annotated[float | None, typer.Option(
        "--head-epochs", help="Head-only epochs before fine-tuning (default: finetune epochs / 6).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Alignment batch size (CKA depends on it).")] = 256,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate (alignment and fine-tuning).")] = 1e-3,
    guide_init: Annotated[list[str] | None, typer.Option(
        "--guide-init", help="trained (the guide as loaded/trained) or random (an untrained copy); comma list.",
        show_default="trained", metavar=LIST)] = None,
    train_guide: Annotated[float, typer.Option(
        "--train-guide", help="Train the guide on the task for this many epochs first (0 = use as is).")] = 0,
    plateau_window: Annotated[int, typer.Option(
        "--plateau-window", help="Steps of the alignment-loss EMA between plateau checks (0 = off).")] = 100,
    plateau_factor: Annotated[float, typer.Option(
        "--plateau-factor", help="LR multiplier when the alignment-loss EMA plateaus.")] = 0.5,
    val_fraction: Annotated[float, typer.Option(
        "--val-fraction", help="Share of the training split held out for validation: it picks the guide's best "
                               "epoch and stops the baselines (the test split chooses nothing; 0 = none).")] = 0.1,
    baseline_epochs: Annotated[float, typer.Option(
        "--baseline-epochs", help="Baselines train with the fine-tuning recipe for this many epochs or the "
                                  "conversion's optimizer-step count, whichever is longer; the best validation "
                                  "epoch is kept.")] = 60,
    baseline_max_epochs: Annotated[float, typer.Option(
        "--baseline-max-epochs", help="Cap of --baseline-epochs (the conversion's step count, if longer, wins).")] = 200,
    baseline_budget: BaselineBudgetOpt = "steps",
    baseline_patience: Annotated[int, typer.Option(
        "--baseline-patience", help="A baseline whose best validation epoch is within its last this-many epochs "
                                    "is flagged as still improving.")] = 10,
    guide_lr: Annotated[float, typer.Option(
        "--guide-lr", help="--train-guide learning rate (AdamW, cosine decay, batch 128, the best validation "
                           "epoch kept).")] = 1e-2,
    seeds: SeedsOpt = 1,
    kd_alpha: KdAlphaOpt = 0.5,
    kd_temperature: KdTemperatureOpt = 4.0,
    align_val: AlignValOpt = False,
    align_data: AlignDataOpt = None,
    weights: Annotated[Path | None, typer.Option("--weights", help="Local weights file for GUIDE.")] = None,
    n: NOpt = None,
    seed: SeedOpt = 0,
    data_seed: DataSeedOpt = 0,
    trust: TrustOpt = False,
    device: DeviceOpt = "cpu",
    resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit convert`: convert GUIDE into a target architecture (plus baselines), into --out."""
    from simkit.conversion import ConvertSettings, convert, load_plan_file
    from simkit.data import load_data

    settings = ConvertSettings(
        steps_per_stage=steps_per_stage, max_stage_steps=max_stage_steps, stop_loss=stop_loss,
        plateau_factor=plateau_factor, val_fraction=val_fraction, baseline_epochs=baseline_epochs,
        baseline_max_epochs=baseline_max_epochs, baseline_patience=baseline_patience, guide_lr=guide_lr,
        recipe=None if plan else recipe, schedule=split_list(schedule) or ["progressive"],
        metric=split_list(metric) or ["linear_cka"], plan=plan, rank=rank, group=group, cell=cell,
        baselines=[] if baselines.strip().lower() == "none" else split_list(baselines), finetune_epochs=finetune_epochs,
        head_epochs=head_epochs, batch_size=batch_size, lr=lr, guide_init=split_list(guide_init) or ["trained"],
        train_guide=train_guide, plateau_window=plateau_window, seed=seed, n=n, seeds=seeds, kd_alpha=kd_alpha,
        kd_temperature=kd_temperature, align_val=align_val, align_data=align_data, baseline_budget=baseline_budget).validate()
    run_dir = cli_run_dir("convert", out, resume, {**settings.to_dict(), "guide": guide, "data": data,
                                                   "weights": weights, "data_seed": data_seed},
                          files=INPUT_FILES)
    guide_model, source = _guides(guide, seed, seeds, trust, weights)
    dataset = load_data(data, n=n, seed=data_seed).with_test_split(data_seed)  # held out by the data seed
    replacement_plan = load_plan_file(plan, guide_model) if plan else None
    extra = load_data(align_data, seed=data_seed) if align_data else None
    result = convert(source, dataset, settings, plan=replacement_plan, run_dir=run_dir, resume=resume, device=device,
                     guide_name=guide, data_name=data, align_data=extra)
    _echo(result)
    finish(result, out, no_report)


def _guides(spec: str, seed: int, seeds: int, trust: bool, weights: Path | None):
    """(the guide of ``seed``, what ``convert`` takes): that guide for one seed; for several, a factory that
    builds each seed's guide with its seed (zoo specs: their own initialisation; files: the same weights)."""
    first = load_cli_model(spec, seed=seed, trust=trust, weights=weights)
    if seeds == 1:
        return first, first
    return first, lambda model_seed: first if model_seed == seed else load_cli_model(
        spec, seed=model_seed, trust=trust, weights=weights)


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

