"""`simkit stitch`: standard and invariance-aware model stitching of A's front into B's back half."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

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


class IRISeed(str, Enum):
    data = "data"
    noise = "noise"


class IRIOptimizer(str, Enum):
    sgd = "sgd"
    adam = "adam"


class Init(str, Enum):
    lstsq = "lstsq"
    default = "default"


def seeded_models(spec: str, side: str, seed: int, trust: bool, weights: Path | None) -> Callable[[int], Any]:
    """One side's models per seed by the pair seed rule (``simkit.seeding.pair_seeds``): a factory
    ``seed -> nn.Module``; the first seed's model is loaded now, so a bad spec fails before the run."""
    from simkit.seeding import pair_seeds

    first = load_cli_model(spec, seed=pair_seeds(seed)[side], trust=trust, weights=weights)
    return lambda s: first if s == seed else load_cli_model(spec, seed=pair_seeds(s)[side], trust=trust,
                                                            weights=weights)


@command("stitch", help=(
    "Stitch model A's front half into model B's back half at layer pairs and measure the stitching "
    "penalty (B's accuracy minus the stitched accuracy; penalty_min: the lower of A's and B's accuracies minus "
    "it) on the evaluation set (the test split of --data, or --test-data). With --iri the invariance-aware "
    "arm (stitches trained only on IRIs of A) runs beside the standard one; --train E trains A and B first. A model at chance and IRIs that missed their "
    "tolerance are warned about. Writes stitching.csv, result.json and report.html to --out."))
def stitch_command(
    model_a: Annotated[str, typer.Argument(help="Front model spec (A), e.g. simkit:cnn1d or file:a.safetensors.")],
    model_b: Annotated[str, typer.Argument(help="Back model spec (B).")],
    out: OutOpt,
    data: DataOpt = "mnist1d",
    test_data: Annotated[str | None, typer.Option(
        "--test-data", help="Evaluation data spec of its own (its test split if it has one, else all of it); "
        "all of --data then trains the stitches. Default: the test split of --data.",
        show_default=False)] = None,
    layer_a: Annotated[list[str] | None, typer.Option(
        "--layer-a", help="Layers of A (module names; repeatable or comma list; pairs up with --layer-b).", metavar=LIST)] = None,
    layer_b: Annotated[list[str] | None, typer.Option(
        "--layer-b", help="Layers of B (module names; repeatable or comma list).", metavar=LIST)] = None,
    layers: Annotated[str | None, typer.Option(
        "--layers", help="'auto': pair the blocks of A and B by relative depth.")] = None,
    objective: Annotated[list[str] | None, typer.Option(
        "--objective", help="Comma list of hlm, slm, dm, fula (default fula).", metavar=LIST)] = None,
    iri: Annotated[bool, typer.Option("--iri", help="Add the invariance-aware arm (train on IRIs).",
                                      metavar=FLAG)] = False,
    steps: Annotated[int, typer.Option("--steps", help="Stitch training steps (0 = least-squares init only).")] = 300,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Stitch training batch size.")] = 128,
    lr: Annotated[float, typer.Option("--lr", help="Stitch learning rate (Adam).")] = 1e-3,
    init: Annotated[Init, typer.Option("--init", help="Stitch init: least squares or PyTorch default.")] = Init.lstsq,
    iri_steps: Annotated[int, typer.Option("--iri-steps", help="Max IRI optimisation steps per attempt.")] = 300,
    iri_tol: Annotated[float, typer.Option("--iri-tol", help="IRI relative-error tolerance (early stop).")] = 0.05,
    iri_seed: Annotated[IRISeed, typer.Option(
        "--iri-seed", help="Start IRIs from another training input (data) or uniform noise.")] = IRISeed.data,
    iri_optimizer: Annotated[IRIOptimizer, typer.Option(
        "--iri-optimizer", help="adam: Adam on x (reaches the tolerance far more often); sgd: x ← clamp(x − "
        "step·∇) (the spec's).")] = IRIOptimizer.adam,
    iri_step_size: Annotated[float, typer.Option("--iri-step-size", help="sgd step on the inputs.")] = 0.5,
    iri_lr: Annotated[float, typer.Option("--iri-lr", help="adam learning rate on the inputs.")] = 0.1,
    iri_batch_size: Annotated[int, typer.Option("--iri-batch-size", help="Inputs optimised together.")] = 256,
    iri_restarts: Annotated[int, typer.Option(
        "--iri-restarts", help="Restart inputs still above --iri-tol from a new seed, up to this many times.")] = 3,
    train: Annotated[float, typer.Option(
        "--train", help="Train A and B on --data for this many epochs first (0 = use them as they are).")] = 0.0,
    seeds: Annotated[int, typer.Option(
        "--seeds", help="Repeat for seeds --seed, --seed+1, ... (this many): models built (A with the seed, B "
        "with seed+1) and trained per seed, IRIs and stitches per seed; stitching_mean.csv and "
        "iri_differences.csv give means and 95 % t intervals over seeds.")] = 1,
    val_every: Annotated[int, typer.Option(
        "--val-every", help="Score each stitch on a validation split of the stitching data every this many "
        "steps (and at step 0) and keep the best step's stitch (0 = off: keep the last).")] = 0,
    val_fraction: Annotated[float, typer.Option(
        "--val-fraction", help="Fraction of the stitching data held out for --val-every (drawn by --seed; "
        "never the evaluation set).")] = 0.1,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", help="IRI cache directory (default: runs/.iri-cache).", show_default=False)] = None,
    weights_a: Annotated[Path | None, typer.Option(
        "--weights-a", help="Local weights file for A (every seed loads it).")] = None,
    weights_b: Annotated[Path | None, typer.Option(
        "--weights-b", help="Local weights file for B (every seed loads it).")] = None,
    name_a: Annotated[str | None, typer.Option(
        "--name-a", help="Name of A in the report and summary (default: its spec).", show_default=False)] = None,
    name_b: Annotated[str | None, typer.Option(
        "--name-b", help="Name of B in the report and summary (default: its spec).", show_default=False)] = None,
    n: NOpt = None,
    seed: SeedOpt = 0,
    data_seed: DataSeedOpt = 0,
    device: DeviceOpt = "cpu",
    trust: TrustOpt = False,
    resume: ResumeOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit stitch`: stitch A's front into B's back at layer pairs, measure the penalty, into --out."""
    from simkit.data import load_data
    from simkit.stitching import runner
    from simkit.stitching.settings import StitchSettings

    settings = StitchSettings(
        layer_a=split_list(layer_a) or None, layer_b=split_list(layer_b) or None, layers=layers,
        objective=split_list(objective) or ["fula"], iri=iri, steps=steps, batch_size=batch_size, lr=lr,
        init=init.value, iri_steps=iri_steps, iri_tol=iri_tol, iri_seed=iri_seed.value,
        iri_optimizer=iri_optimizer.value, iri_step_size=iri_step_size, iri_lr=iri_lr,
        iri_batch_size=iri_batch_size, iri_restarts=iri_restarts, n=n, seed=seed, train=train, seeds=seeds,
        val_every=val_every, val_fraction=val_fraction).validate()
    run_dir = cli_run_dir("stitch", out, resume, {**settings.to_dict(), "model_a": model_a, "model_b": model_b,
                                                  "data": data, "test_data": test_data, "data_seed": data_seed,
                                                  "weights_a": weights_a, "weights_b": weights_b},
                          files={"model_a": "model", "model_b": "model", "data": "data",
                                 "test_data": "data", "weights_a": "path",
                                 "weights_b": "path"})  # checked, not started
    # A gets the seed, B seed + 1 (simkit.seeding.pair_seeds): the same spec twice gives two networks
    build_a = seeded_models(model_a, "model_a", seed, trust, weights_a)
    build_b = seeded_models(model_b, "model_b", seed, trust, weights_b)
    dataset = load_data(data, n=n, seed=data_seed)  # held out by the data seed unless --test-data evaluates
    dataset = dataset if test_data is not None else dataset.with_test_split(data_seed)
    evaluation = load_data(test_data, seed=data_seed) if test_data is not None else None
    result = runner.stitch(build_a, build_b, dataset, settings, test_data=evaluation, run_dir=run_dir, resume=resume,
                           device=device,
                           cache_dir=runner.DEFAULT_CACHE if cache_dir is None else cache_dir,
                           names=(name_a or model_a, name_b or model_b))
    finish(result, out, no_report)   # its warnings: once each, as one line (simkit.cli.common.WarningChannel)
