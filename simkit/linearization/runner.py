"""The linearization experiment: swap ReLUs for slopes, post-train an ω sweep, measure path lengths.

For every seed, granularity (channel, layer) and ω, a fresh copy of the trained network gets its
ReLUs swapped for SlopeReLUs (α = 0, same outputs bit for bit) and is post-trained with
cross-entropy + ω·Σ(|1 − α| + ε)^0.5 under the freeze rule (see ``simkit.linearization.prelu``). Each
run is a named stage of the shared training loop (``linearize_<granularity>_w<ω>``, ω written exactly,
``_s<seed>`` appended when several seeds run: see :mod:`simkit.linearization.labels`), so ``resume``
skips finished runs and continues an interrupted one. Then: test accuracy, NAPL and the path-length
distribution (``simkit.linearization.napl``), the fraction still nonlinear per layer, optionally the
folded network's depth and size, and linear CKA of every activation site against the original's.
With ``recover`` > 0 each run is then fine-tuned with its slopes fixed and the penalty dropped
(``simkit.linearization.recover``, stage ``<run stage>_recover``) and its test accuracy measured again;
``recover_shape`` first resets every slope not at 1 to 0 (the run's shape: linear or ReLU units) and
``recover_val_fraction`` keeps recovery's best epoch on a validation part of the training split (drawn
by ``derive_seed(seed, "recover-val")``; recovery then trains on the rest). ``napl_threshold`` counts a
unit as nonlinear only when |1 − α| exceeds it (NAPL, APL, the nonlinear fractions).
Over seeds: mean ± spread per granularity × ω (``simkit.linearization.aggregate``) and the
channel − layer difference at matched NAPL (``simkit.linearization.matched``).
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.data import Dataset, check_finite
from simkit.engine import compare
from simkit.errors import SimkitError
from simkit.forward import ModelSource, build_model, check_accepts, eval_mode, modes_kept, resolve_device
from simkit.linearization.aggregate import aggregate_runs, mean_over_seeds
from simkit.linearization.fold import fold_linear_stretches
from simkit.linearization.labels import omega_text, run_label, stage_name
from simkit.linearization.matched import highest_matched, lowest_matched, matched_napl, matched_over_seeds
from simkit.linearization.napl import PathLengths, path_lengths
from simkit.linearization.prelu import explicit_relus, site_channels, swap_relus
from simkit.linearization.recover import recover, recover_best, reset_shape
from simkit.linearization.slope import FREEZE_TOL, FreezeRule, SlopeReLU, slope_modules, slope_penalty
from simkit.linearization.units import unit_statistics
from simkit.provenance import run_meta, weights_words
from simkit.results import LinearizeResult
from simkit.rundir import RunDir, fingerprint, open_run_dir
from simkit.seeding import derive_seed
from simkit.settings.linearize import LinearizeSettings
from simkit.surgery import bit_mismatches
from simkit.training import TrainConfig, TrainHistory, evaluate_accuracy, fit, train_classifier

RUN_COLUMNS = ["granularity", "omega", "napl", "nonlinear_fraction", "accuracy", "seed", "apl", "active_layers",
               "frozen_fraction", "mean_alpha", "bit_exact_at_start", "final_loss", "steps", "time_s", "run",
               "linearized_fraction", "mean_abs_one_minus_alpha"]
# with ``recover`` > 0: after recovery (accuracy_recovered), its last loss and steps
# with ``recover_shape``: the accuracy right after the reset; with ``recover_val_fraction``: the kept step and
# its validation accuracy
RECOVER_COLUMNS = ["accuracy_recovered", "final_loss_recovered", "steps_recovered", "accuracy_shape_reset",
                   "recover_best_step", "recover_val_accuracy"]

# what ``linearize`` takes as its model: a module, or a factory building the model of each seed

__all__ = ["ModelSource", "linearize", "matched_napl", "omega_text", "post_train", "run_label"]


def _labelled(data: Dataset, seed: int) -> tuple[Dataset, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """The training split of a labelled Dataset with tensor inputs (native or seeded split) and
    (x, y, x_test, y_test) of both splits."""
    if data.labels is None:
        raise SimkitError(f"data {data.spec!r} has no labels; linearization post-trains with cross-entropy, "
                          "so use labelled data (mnist1d, digits, npy:PATH with labels=...)")
    if isinstance(data.inputs, dict):
        raise SimkitError("linearize takes tensor inputs, not tokenised text; use an image or vector data spec")
    train, test = data.train_test(seed=seed)
    x, y, x_test, y_test = train.inputs, train.labels, test.inputs, test.labels
    if not (isinstance(x, Tensor) and isinstance(y, Tensor) and isinstance(x_test, Tensor)
            and isinstance(y_test, Tensor)):
        raise SimkitError(f"the test split of data {data.spec!r} has no labels or no tensor inputs; "
                          "linearization measures test accuracy, so use labelled data")
    return train, (x, y, x_test, y_test)


def _bit_exact(a: nn.Module, b: nn.Module, x: Tensor) -> bool:
    """Whether a(x) and b(x) agree bit for bit (eval mode for both; modes restored)."""
    with eval_mode(a, b), torch.no_grad():
        ya, yb = a(x), b(x)
    return bit_mismatches(ya, yb) == 0


def post_train(model: nn.Module, x: Tensor, y: Tensor, *, omega: float, epochs: float = 1.0, lr: float = 1e-3,
               slope_lr: float = 1e-2, batch_size: int = 128, eps: float = 1e-3, tol: float = FREEZE_TOL,
               seed: int = 0, run_dir: str | Path | None = None, name: str = "linearize", resume: bool = False,
               progress: bool = False, callback: Callable[[int, float], None] | None = None,
               description: str | None = None) -> TrainHistory:
    """Post-train a swapped model with CE + ω·penalty under the freeze rule; returns the TrainHistory.

    x: (n, ...) inputs, y: (n,) labels. Slopes get their own learning rate and no weight decay.
    run_dir / name: where the training loop checkpoints (``<run_dir>/checkpoints/<name>.pt``; None: no
    files). description: the progress bar's text (default ``name``). The model is in train mode while
    training and in eval mode afterwards.
    callback(step, loss) runs after every step (after the freeze rule), as in :func:`fit`.
    """
    slopes = [m for _, m in slope_modules(model)]
    alpha_ids = {id(m.alpha) for m in slopes}
    weights = [p for p in model.parameters() if p.requires_grad and id(p) not in alpha_ids]
    optimizer = torch.optim.AdamW([{"params": weights, "lr": lr, "weight_decay": 0.0},
                                   {"params": [m.alpha for m in slopes], "lr": slope_lr, "weight_decay": 0.0}])
    config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
                         description=name if description is None else description)

    def loss_fn(batch: tuple[Tensor, ...]) -> Tensor:
        xb, yb = batch
        return F.cross_entropy(model(xb), yb) + omega * slope_penalty(slopes, eps)

    model.train()
    try:
        with FreezeRule(slopes, optimizer, tol):
            return fit(model, loss_fn, (x, y), config, optimizer=optimizer, run_dir=run_dir, name=name,
                       resume=resume, callback=callback)
    finally:
        model.eval()


def linearize(model: ModelSource, data: Dataset, settings: LinearizeSettings | None = None, *,
              run_dir: RunDir | str | Path | None = None, resume: bool = False,
              device: str | torch.device = "cpu", progress: bool = True, model_name: str | None = None,
              data_name: str | None = None) -> LinearizeResult:
    """Linearize a trained ReLU network over seeds × granularities × ω values (see ``LinearizeSettings``).

    model: a classifier (N, ...) → logits (N, classes) that torch.fx can trace, or a factory
        ``model(seed) -> nn.Module`` called once per seed of ``settings.seed_list()`` (independent
        initialisations; the CLI passes one). A module is not changed unless ``settings.train`` > 0
        (then it is trained first, as stage ``pretrain``; with several seeds it trains for the first
        seed and copies of it, taken before any training, for the others: the same initial weights, so
        only batch order differs between seeds); its modules' train/eval flags are restored on return.
    data: a labelled ``simkit.data.Dataset`` with tensor inputs (its native test split, else an 80/20
        split seeded by ``settings.seed``: one split for every seed).
    run_dir: where checkpoints go (None: nowhere): a ``simkit.RunDir`` as it is, or a path checked
        against these settings and fingerprints of the (first seed's) model and of ``data``, so
        ``resume=True`` (skip finished runs, continue an interrupted one) refuses other inputs. Nothing
        is written there before every input is validated.
    device: ``cpu``, ``cuda`` or ``cuda:N``; the model is moved there (and stays there), with the data,
        the swapped copies and all losses.
    model_name / data_name: what ``meta`` calls them (default: the model's class name, ``data.spec``).
    Returns a LinearizeResult (see its docstring for the tables). A run that linearized nothing (no
    slope reached α = 1) is warned about (RuntimeWarning) and listed in ``summary["unchanged_runs"]``.
    """
    started = time.perf_counter()
    settings = (settings if settings is not None else LinearizeSettings()).validate()
    device = resolve_device(device)
    if isinstance(data, Dataset):
        check_finite(data)
    train, tensors = _labelled(data, settings.seed)
    seeds = settings.seed_list()
    first = build_model(model, seeds[0], "model")
    inputs = _inputs(settings, first, data) if isinstance(run_dir, str | Path) else {}
    x, y, x_test, y_test = (t.to(device) for t in tensors)
    with modes_kept(first):
        first.to(device)
        explicit_relus(first)   # fail early: untraceable or no ReLU
        with eval_mode(first):
            check_accepts(first, x[:2], "the model")
        opened = open_run_dir(run_dir, "linearize", inputs, resume=resume)
        if opened is not None:
            opened.start()
        return _sweep(model, first, settings, train, (x, y, x_test, y_test), opened, device, progress, started,
                      model_name=type(first).__name__ if model_name is None else model_name,
                      data_name=data.spec if data_name is None else data_name)


def _inputs(settings: LinearizeSettings, model: nn.Module, data: Dataset) -> dict[str, Any]:
    """What a Python caller's run directory is tied to: the settings, and fingerprints of the model as
    given (before any training) and of the data (its test split included)."""
    return {**settings.to_dict(), "model": fingerprint(model), "data": fingerprint(data)}


def _seed_models(model: ModelSource, first: nn.Module, s: LinearizeSettings,
                 device: torch.device) -> tuple[Callable[[int, int], nn.Module], str]:
    """(model of the i-th seed, how the seeds' models differ) for the sweep, before any training."""
    if not isinstance(model, nn.Module):
        return (lambda i, seed: first if i == 0 else build_model(model, seed, "model").to(device)), "built for each seed"
    if s.train > 0 and s.seeds > 1:
        copies = [copy.deepcopy(first) for _ in range(s.seeds - 1)]
        return (lambda i, seed: first if i == 0 else copies[i - 1]), "copies of the given model (same initial weights)"
    return (lambda i, seed: first), "the given model"


class _Tables:
    """The rows of every table, filled run by run."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.layers: list[dict[str, Any]] = []
        self.cka: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []
        self.dists: list[dict[str, Any]] = []
        self.warnings: list[str] = []


def _weights(first: nn.Module, s: LinearizeSettings, seed_models: str) -> dict[str, str]:
    """``meta.weights``: the model's weights in words, and the training this run gave it."""
    return {"model": weights_words(first, s.train, len(s.seed_list()) if seed_models.startswith("built") else 1)}


def _sweep(model: ModelSource, first: nn.Module, s: LinearizeSettings, train: Dataset,
           tensors: tuple[Tensor, Tensor, Tensor, Tensor], rundir: RunDir | None, device: torch.device,
           progress: bool, started: float, *, model_name: str, data_name: str) -> LinearizeResult:
    """The sweep itself, once every input is validated and the run directory started. train: the
    training split (CPU); tensors: (x, y, x_test, y_test) on ``device``."""
    x, y, x_test, y_test = tensors
    run_dir = rundir.path if rundir is not None else None
    resume = rundir.resume if rundir is not None else False
    granularities, omegas, seeds = s.granularities(), s.omegas(), s.seed_list()
    several = len(seeds) > 1
    model_of, seed_models = _seed_models(model, first, s, device)
    timings: dict[str, float] = {}
    tables = _Tables()
    originals: list[dict[str, Any]] = []
    total, done = len(seeds) * len(granularities) * len(omegas), 0
    for i, seed in enumerate(seeds):
        net = model_of(i, seed)
        if s.train > 0:
            t0 = time.perf_counter()
            stage = f"pretrain_s{seed}" if several else "pretrain"
            config = TrainConfig(epochs=s.train, batch_size=s.batch_size, lr=s.lr, seed=seed, progress=progress,
                                 description=f"pretrain seed={seed}" if several else "pretrain")
            train_classifier(net, train, config, run_dir=run_dir, name=stage, resume=resume)
            timings[stage] = time.perf_counter() - t0
        net.eval()
        original, sites = explicit_relus(net)
        original.eval()
        site_channels(original, sites, x[:2])
        example = x[: min(len(x), 8)]
        original_paths = path_lengths(original, example)
        originals.append({"seed": seed, "accuracy": evaluate_accuracy(net, x_test, y_test),
                          "paths": original_paths, "sites": sites})
        units = {site.name: site.channels for site in sites}   # channels of each site, whatever the granularity
        recovery_data = _recovery_split(x, y, s, seed)
        tables.dists += _dist_rows("original", original_paths, "original", float("nan"), seed)
        for granularity in granularities:
            for omega in omegas:
                done += 1
                label = run_label(granularity, omega, seed if several else None)
                t0 = time.perf_counter()
                linear, _ = swap_relus(net, granularity, example)
                exact = _bit_exact(net, linear, x_test[:256])
                history = post_train(linear, x, y, omega=omega, epochs=s.epochs, lr=s.lr, slope_lr=s.slope_lr,
                                     batch_size=s.batch_size, eps=s.eps, tol=s.freeze_tol, seed=seed,
                                     run_dir=run_dir, name=stage_name(granularity, omega, seed if several else None),
                                     resume=resume, progress=progress, description=f"{label} [{done}/{total}]")
                row = _measure(linear, x_test, y_test, example, units, s)
                row.update(granularity=granularity, omega=omega, seed=seed, bit_exact_at_start=exact,
                           final_loss=history.losses[-1] if history.losses else float("nan"),
                           steps=history.steps, run=label)
                if row["frozen_fraction"] == 0:
                    message = (f"run {label} linearized nothing: no slope reached α = 1, so NAPL stays at the "
                               f"original {original_paths.napl:g}; raise `omega`, `epochs` or `slope_lr`")
                    tables.warnings.append(message)
                    warnings.warn(message, RuntimeWarning, stacklevel=3)   # points at linearize's caller
                paths = row.pop("paths")
                tables.dists += _dist_rows(label, paths, granularity, omega, seed)
                for layer, module in slope_modules(linear):
                    tables.layers.append({"run": label, "granularity": granularity, "omega": omega, "seed": seed,
                                          "layer": layer, "channels": units[layer], "slopes": module.channels,
                                          "nonlinear_fraction": module.nonlinear_fraction(s.napl_threshold)})
                tables.history += [{"run": label, "step": k + 1, "loss": v} for k, v in enumerate(history.losses)]
                if s.cka:
                    cka_rows = _cka_rows(label, original, linear, x_test[:s.cka_samples],
                                         [site.name for site in sites], seed, device, progress)
                    tables.cka += [{**r, "granularity": granularity, "omega": omega, "seed": seed} for r in cka_rows]
                if s.recover > 0:   # after every measurement of the post-trained run: they stay "before"
                    row.update(_recover_run(linear, recovery_data, (x_test, y_test), s, seed=seed, run_dir=run_dir,
                                            name=stage_name(granularity, omega, seed if several else None)
                                            + "_recover", resume=resume, progress=progress,
                                            description=f"{label} recover [{done}/{total}]"))
                row["time_s"] = timings[label] = time.perf_counter() - t0
                tables.runs.append(row)
    timings["total"] = time.perf_counter() - started
    meta = run_meta(model=model_name, data=data_name, granularities=granularities, omegas=omegas,
                    epochs=s.epochs, lr=s.lr, slope_lr=s.slope_lr, batch_size=s.batch_size, eps=s.eps,
                    freeze_tol=s.freeze_tol, napl_threshold=s.napl_threshold, fold=s.fold, train_epochs=s.train,
                    seed=s.seed, seeds=seeds,
                    seed_models=seed_models, weights=_weights(first, s, seed_models), n_train=len(x),
                    n_test=len(x_test), device=str(device),
                    settings=s.to_dict(), timings=timings)
    return _result(tables, originals, seeds, int(torch.cat([y, y_test]).max()) + 1, s.cka, meta)


def _measure(linear: nn.Module, x_test: Tensor, y_test: Tensor, example: Tensor, units: dict[str, int],
             s: LinearizeSettings) -> dict[str, Any]:
    """What one post-trained run measures: accuracy, path lengths (``paths``), slope statistics, fold."""
    paths = path_lengths(linear, example, s.napl_threshold)
    slopes = list(slope_modules(linear))
    alphas = torch.cat([m.effective_alpha().detach() for _, m in slopes])
    row: dict[str, Any] = {
        "napl": paths.napl, "nonlinear_fraction": _unit_fraction(slopes, units, s.napl_threshold),
        "accuracy": evaluate_accuracy(linear, x_test, y_test), "apl": paths.apl,
        "active_layers": sum(m.nonlinear_fraction(s.napl_threshold) > 0 for _, m in slopes),
        "frozen_fraction": float(torch.cat([m.frozen for _, m in slopes]).float().mean()),
        "mean_alpha": float(alphas.mean()), "paths": paths, **unit_statistics(slopes, units)}
    if s.fold:
        row.update(_fold_row(linear, x_test, y_test))
    return row


def _result(tables: _Tables, originals: list[dict[str, Any]], seeds: list[int], num_classes: int, cka: bool,
            meta: dict[str, Any]) -> LinearizeResult:
    """The LinearizeResult of a finished sweep: tables, per-seed and over-seed summaries."""
    runs = tables.runs
    extra = [c for c in (runs[0] if runs else {}) if c not in RUN_COLUMNS and c not in RECOVER_COLUMNS]
    recovered = [c for c in RECOVER_COLUMNS if runs and c in runs[0]]
    columns = RUN_COLUMNS + extra + recovered
    runs_frame = pd.DataFrame(runs).reindex(columns=columns)
    matched = matched_napl(runs_frame)
    over_seeds = matched_over_seeds(matched)
    lowest = lowest_matched(over_seeds, len(seeds), originals[0]["paths"].napl)
    by_fraction = matched_napl(runs_frame, x="linearized_fraction")
    fraction_over_seeds = matched_over_seeds(by_fraction, x="linearized_fraction")
    highest = highest_matched(fraction_over_seeds, len(seeds))
    layers, dists = pd.DataFrame(tables.layers), pd.DataFrame(tables.dists)
    frames = {"runs": runs_frame, "layers": layers, "distributions": dists,
              "history": pd.DataFrame(tables.history, columns=["run", "step", "loss"]), "matched": matched,
              "matched_mean": over_seeds, "aggregate": aggregate_runs(runs_frame),
              "matched_fraction": by_fraction, "matched_fraction_mean": fraction_over_seeds,
              "layers_mean": mean_over_seeds(layers, ["granularity", "omega", "layer"], "nonlinear_fraction"),
              "distributions_mean": mean_over_seeds(dists, ["granularity", "omega", "length"], "probability")}
    if cka:
        frames["cka"] = pd.DataFrame(tables.cka, columns=["run", "granularity", "omega", "seed", "layer_a", "layer_b",
                                                          "linear_cka"])
        frames["cka_mean"] = mean_over_seeds(frames["cka"], ["granularity", "omega", "layer_a", "layer_b"],
                                             "linear_cka")
    paths, sites = originals[0]["paths"], originals[0]["sites"]
    accuracies = [o["accuracy"] for o in originals]
    summary = {"original_accuracy": float(np.mean(accuracies)), "original_napl": paths.napl,
               "runs": runs_frame.to_dict(orient="records"), "original_apl": paths.apl,
               "original_distribution": paths.distribution.tolist(), "sites": [site.name for site in sites],
               "num_units": int(sum(site.channels for site in sites)), "seeds": seeds,
               "original_accuracies": accuracies, "chance_accuracy": 1.0 / num_classes,
               "unchanged_runs": [r["run"] for r in runs if r["frozen_fraction"] == 0],
               "lowest_matched_napl": None if lowest is None else lowest["napl"],
               "lowest_matched_difference": None if lowest is None else lowest["difference_mean"],
               "lowest_matched_difference_std": None if lowest is None or len(seeds) < 2
               else lowest["difference_std"],
               **_interval_keys("lowest_matched", lowest, len(seeds)),
               "highest_matched_fraction": None if highest is None else highest["linearized_fraction"],
               "highest_matched_fraction_difference": None if highest is None else highest["difference_mean"],
               "highest_matched_fraction_difference_std": None if highest is None or len(seeds) < 2
               else highest["difference_std"],
               **_interval_keys("highest_matched_fraction", highest, len(seeds)),
               "warnings": list(dict.fromkeys(tables.warnings))}
    return LinearizeResult(summary=summary, tables=frames, meta=meta)


def _interval_keys(prefix: str, row: dict[str, Any] | None, seeds: int) -> dict[str, Any]:
    """``<prefix>_difference_low`` / ``_high`` (the 95 % t interval of the paired channel − layer
    difference; null with one seed or no matched point) and ``<prefix>_verdict`` (``simkit.stats.verdict``
    of "channel-wise ahead"; null without a matched point)."""
    several = row is not None and seeds > 1
    return {f"{prefix}_difference_low": float(row["difference_low"]) if several and row else None,
            f"{prefix}_difference_high": float(row["difference_high"]) if several and row else None,
            f"{prefix}_verdict": None if row is None else str(row["verdict"])}


def _unit_fraction(slopes: Sequence[tuple[str, SlopeReLU]], units: dict[str, int], threshold: float = 0.0) -> float:
    """Fraction of all activation units (channels of every site) still nonlinear (α ≠ 1; with
    ``threshold`` > 0, |1 − α| > threshold)."""
    total = sum(units[name] for name, _ in slopes)
    return sum(m.nonlinear_fraction(threshold) * units[name] for name, m in slopes) / total


def _recovery_split(x: Tensor, y: Tensor, s: LinearizeSettings,
                    seed: int) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
    """(inputs, labels recovery trains on, validation (x_val, y_val) or None): with
    ``recover_val_fraction`` > 0 a random part of the training split (at least one sample, drawn by
    ``derive_seed(seed, "recover-val")``) is held out; else everything trains and nothing validates."""
    if s.recover == 0 or s.recover_val_fraction == 0:
        return x, y, None
    n_val = max(1, round(s.recover_val_fraction * len(x)))
    if n_val >= len(x):
        raise SimkitError(f"`recover_val_fraction` {s.recover_val_fraction:g} leaves no training sample of "
                          f"{len(x)}; lower it")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(derive_seed(seed, "recover-val")))
    val, fit_part = order[:n_val].to(x.device), order[n_val:].to(x.device)
    return x[fit_part], y[fit_part], (x[val], y[val])


def _recover_run(linear: nn.Module, data: tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None],
                 test: tuple[Tensor, Tensor], s: LinearizeSettings, **stage: Any) -> dict[str, Any]:
    """Recover one post-trained run (after its "before" measurements) and return its recovery columns:
    ``accuracy_recovered`` (test), the last loss and steps; with ``recover_shape`` the shape reset first
    (``accuracy_shape_reset``); with a validation split the best epoch kept (``recover_best_step``,
    ``recover_val_accuracy``). ``stage``: seed, run_dir, name, resume, progress, description."""
    x, y, validation = data
    row: dict[str, Any] = {}
    if s.recover_shape:
        reset_shape(linear)
        row["accuracy_shape_reset"] = evaluate_accuracy(linear, *test)
    if validation is None:
        history = recover(linear, x, y, epochs=s.recover, lr=s.lr, batch_size=s.batch_size, **stage)
    else:
        kept = recover_best(linear, x, y, validation, epochs=s.recover, lr=s.lr, batch_size=s.batch_size, **stage)
        history = kept.history
        row.update(recover_best_step=kept.best_step, recover_val_accuracy=kept.val_accuracy)
    return {"accuracy_recovered": evaluate_accuracy(linear, *test),
            "final_loss_recovered": history.losses[-1] if history.losses else float("nan"),
            "steps_recovered": history.steps, **row}


def _dist_rows(label: str, paths: PathLengths, granularity: str, omega: float, seed: int) -> list[dict[str, Any]]:
    """Rows of the distributions table for one run (granularity "original", ω NaN for the original)."""
    length = max(len(paths.distribution), len(paths.apl_distribution))
    dist = np.pad(paths.distribution, (0, length - len(paths.distribution)))
    apl = np.pad(paths.apl_distribution, (0, length - len(paths.apl_distribution)))
    return [{"run": label, "granularity": granularity, "omega": omega, "seed": seed, "length": k,
             "probability": float(dist[k]), "apl_probability": float(apl[k])} for k in range(length)]


def _fold_row(model: nn.Module, x_test: Tensor, y_test: Tensor) -> dict[str, Any]:
    folded = fold_linear_stretches(model)
    return {"depth": folded.depth_before, "folded_depth": folded.depth_after,
            "params": folded.params_before, "folded_params": folded.params_after,
            "folded_accuracy": evaluate_accuracy(folded.model, x_test, y_test)}


def _cka_rows(label: str, original: nn.Module, linear: nn.Module, x: Tensor, sites: list[str],
              seed: int, device: torch.device, progress: bool) -> list[dict[str, Any]]:
    """Linear CKA of every linearized site (b) against every original site (a), long format."""
    result = compare(copy.deepcopy(original), linear, x, layers_a=sites, layers_b=sites,
                     metrics=["linear_cka"], mode="exact", batch_size=256, seed=seed, progress=progress,
                     device=device)
    matrix = result.matrix("linear_cka")
    return [{"run": label, "layer_a": a, "layer_b": b, "linear_cka": float(matrix.loc[a, b])}
            for a in matrix.index for b in matrix.columns]
