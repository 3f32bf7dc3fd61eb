"""The linearization experiment: swap ReLUs for slopes, post-train an ω sweep, measure path lengths.

For every granularity (channel, layer) and every ω, a fresh copy of the trained network gets its
ReLUs swapped for SlopeReLUs (α = 0, same outputs bit for bit) and is post-trained with
cross-entropy + ω·Σ(|1 − α| + ε)^0.5 under the freeze rule (see ``simkit.linearization.prelu``). Each
run is a named stage of the shared training loop (``linearize_<granularity>_w<ω>``, ω written exactly:
see :func:`omega_text`), so ``resume`` skips finished runs and continues an interrupted one. Then:
test accuracy, NAPL and the path-length distribution (``simkit.linearization.napl``), the fraction still
nonlinear per layer, optionally the folded network's depth and size, and linear CKA of every
activation site against the original's.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.linearization.napl import path_lengths
from simkit.linearization.prelu import (
    FREEZE_TOL,
    GRANULARITIES,
    FreezeRule,
    explicit_relus,
    site_channels,
    slope_modules,
    slope_penalty,
    swap_relus,
)
from simkit.results import LinearizeResult
from simkit.runinfo import run_meta

RUN_COLUMNS = ["granularity", "omega", "napl", "nonlinear_fraction", "accuracy", "apl", "active_layers",
               "frozen_fraction", "mean_alpha", "bit_exact_at_start", "final_loss", "steps", "time_s"]


def omega_text(omega: float) -> str:
    """ω as text that names exactly one float: ``%g`` when that reads back as the same value (0.001,
    1e-05, 1), else the shortest exact form (``repr``: 1.0000001e-4 → "0.00010000001"); "+" dropped.

    Distinct floats always get distinct texts (each text parses back to its own value), so two ω of a
    sweep that agree to 6 significant digits never share a run label or a checkpoint.
    """
    omega = float(omega) + 0.0  # -0.0 → 0.0
    short = f"{omega:g}"
    return (short if float(short) == omega else repr(omega)).replace("+", "")


def run_label(granularity: str, omega: float) -> str:
    """The run's name in every table and the report: ``"channel ω=0.001"`` (ω as :func:`omega_text`)."""
    return f"{granularity} ω={omega_text(omega)}"


def _labelled(data, seed: int):
    """(train Dataset, test Dataset) of a labelled Dataset with tensor inputs (native or seeded split)."""
    if data.labels is None:
        raise SimkitError(f"data {data.spec!r} has no labels; linearization post-trains with cross-entropy, "
                          "so use labelled data (mnist1d, digits, npy:PATH with labels=...)")
    if isinstance(data.inputs, dict):
        raise SimkitError("linearize takes tensor inputs, not tokenised text; use an image or vector data spec")
    return data.train_test(seed=seed)


def _bit_exact(a: nn.Module, b: nn.Module, x: Tensor) -> bool:
    """Whether a(x) and b(x) agree bit for bit (eval mode for both; modes restored)."""
    from simkit.surgery import bit_mismatches

    was_a, was_b = a.training, b.training
    a.eval()
    b.eval()
    try:
        with torch.no_grad():
            ya, yb = a(x), b(x)
    finally:
        a.train(was_a)
        b.train(was_b)
    return bit_mismatches(ya, yb) == 0


def post_train(model: nn.Module, x: Tensor, y: Tensor, *, omega: float, epochs: float = 1.0, lr: float = 1e-3,
               slope_lr: float = 1e-2, batch_size: int = 128, eps: float = 1e-3, tol: float = FREEZE_TOL,
               seed: int = 0, run_dir: Path | None = None, name: str = "linearize", resume: bool = False,
               progress: bool = False, callback=None):
    """Post-train a swapped model with CE + ω·penalty under the freeze rule; returns the TrainHistory.

    x: (n, ...) inputs, y: (n,) labels. Slopes get their own learning rate and no weight decay.
    callback(step, loss) runs after every step (after the freeze rule), as in :func:`fit`.
    """
    from simkit.training import TrainConfig, fit

    slopes = [m for _, m in slope_modules(model)]
    alpha_ids = {id(m.alpha) for m in slopes}
    weights = [p for p in model.parameters() if p.requires_grad and id(p) not in alpha_ids]
    optimizer = torch.optim.AdamW([{"params": weights, "lr": lr, "weight_decay": 0.0},
                                   {"params": [m.alpha for m in slopes], "lr": slope_lr, "weight_decay": 0.0}])
    config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
                         description=name)

    def loss_fn(batch):
        xb, yb = batch
        return F.cross_entropy(model(xb), yb) + omega * slope_penalty(slopes, eps)

    model.train()
    try:
        with FreezeRule(slopes, optimizer, tol):
            return fit(model, loss_fn, (x, y), config, optimizer=optimizer, run_dir=run_dir, name=name,
                       resume=resume, callback=callback)
    finally:
        model.eval()


def _stage_name(granularity: str, omega: float) -> str:
    """Checkpoint name of one run: ``linearize_channel_w0.001`` (unchanged for ω that ``%g`` spells
    exactly, so older run directories still resume; exact text otherwise, see :func:`omega_text`)."""
    return f"linearize_{granularity}_w{omega_text(omega)}"


def _keeps_modes(run):
    """Decorator: every module of the model (first argument) gets its train/eval flag back on return."""

    @functools.wraps(run)
    def wrapper(model: nn.Module, *args, **kwargs):
        modes = {module: module.training for module in model.modules()}
        try:
            return run(model, *args, **kwargs)
        finally:
            for module, mode in modes.items():
                module.training = mode

    return wrapper


@_keeps_modes
def run_linearization(model: nn.Module, data, *, granularities: Sequence[str] = GRANULARITIES,
                      omegas: Sequence[float] = (1e-4, 1e-3, 1e-2, 1e-1), epochs: float = 5.0,
                      lr: float = 1e-3, slope_lr: float = 1e-2, batch_size: int = 128, eps: float = 1e-3,
                      tol: float = FREEZE_TOL, fold: bool = False, cka: bool = True, cka_samples: int = 512,
                      train_epochs: float = 0.0, seed: int = 0, run_dir: str | Path | None = None,
                      resume: bool = False, progress: bool = True, model_spec: str = "",
                      data_spec: str = "", device: str | torch.device = "cpu") -> LinearizeResult:
    """Linearize a trained ReLU network over granularities × ω values.

    model: a classifier (N, ...) → logits (N, classes) that torch.fx can trace; it is not changed
        unless ``train_epochs`` > 0 (then it is trained first, as stage ``pretrain``); its modules'
        train/eval flags are restored on return.
    data: a labelled ``simkit.data.Dataset`` (its native test split, else an 80/20 split seeded by ``seed``).
    granularities / omegas: every combination is one run; repeated values run once. ω values equal to
        6 significant digits are still distinct runs, with distinct labels and checkpoints.
    device: ``cpu``, ``cuda`` or ``cuda:N``; the model is moved there (and stays there), with the data,
        the swapped copies and all losses.
    Returns a LinearizeResult (see its docstring for the tables).
    """
    from simkit.training import TrainConfig, evaluate_accuracy, train_classifier

    started = time.perf_counter()
    bad = [g for g in granularities if g not in GRANULARITIES]
    if bad or not granularities:
        raise SimkitError(f"unknown granularity {', '.join(map(repr, bad)) or '(none)'}; use channel, layer or both")
    if not omegas or any(not (w >= 0 and math.isfinite(w)) for w in omegas):
        raise SimkitError(f"omega values must be finite numbers >= 0, got {list(omegas)}")
    granularities = list(dict.fromkeys(granularities))
    omegas = list(dict.fromkeys(float(w) + 0.0 for w in omegas))  # an ω listed twice runs once
    if epochs <= 0:
        raise SimkitError(f"--epochs must be > 0 for post-training, got {epochs}")
    device = resolve_device(device)
    train, test = _labelled(data, seed)
    x, y, x_test, y_test = (t.to(device) for t in (train.inputs, train.labels, test.inputs, test.labels))
    model.to(device)
    run_dir = Path(run_dir) if run_dir is not None else None
    explicit_relus(model)   # fail early: untraceable or no ReLU

    timings: dict[str, float] = {}
    if train_epochs > 0:
        t0 = time.perf_counter()
        config = TrainConfig(epochs=train_epochs, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
                             description="pretrain")
        train_classifier(model, train, config, run_dir=run_dir, name="pretrain",
                         resume=resume)
        timings["pretrain"] = time.perf_counter() - t0
    model.eval()
    original, sites = explicit_relus(model)
    original.eval()
    site_channels(original, sites, x[:2])
    example = x[: min(len(x), 8)]
    original_accuracy = evaluate_accuracy(model, x_test, y_test)
    original_paths = path_lengths(original, example)
    site_names = [s.name for s in sites]
    units = {s.name: s.channels for s in sites}      # channels of each site, whatever the granularity

    runs, layers, dists, cka_rows, history_rows = [], [], [], [], []
    dists += _dist_rows("original", original_paths)
    for granularity in granularities:
        for omega in omegas:
            label, name = run_label(granularity, float(omega)), _stage_name(granularity, float(omega))
            t0 = time.perf_counter()
            linear, _ = swap_relus(model, granularity, example)
            exact = _bit_exact(model, linear, x_test[:256])
            history = post_train(linear, x, y, omega=float(omega), epochs=epochs, lr=lr, slope_lr=slope_lr,
                                 batch_size=batch_size, eps=eps, tol=tol, seed=seed, run_dir=run_dir,
                                 name=name, resume=resume, progress=progress)
            accuracy = evaluate_accuracy(linear, x_test, y_test)
            paths = path_lengths(linear, example)
            slopes = list(slope_modules(linear))
            alphas = torch.cat([m.effective_alpha().detach() for _, m in slopes])
            row = {"granularity": granularity, "omega": float(omega), "napl": paths.napl,
                   "nonlinear_fraction": _unit_fraction(slopes, units), "accuracy": accuracy, "apl": paths.apl,
                   "active_layers": sum(m.nonlinear_fraction() > 0 for _, m in slopes),
                   "frozen_fraction": float(torch.cat([m.frozen for _, m in slopes]).float().mean()),
                   "mean_alpha": float(alphas.mean()), "bit_exact_at_start": exact,
                   "final_loss": history.losses[-1] if history.losses else float("nan"),
                   "steps": history.steps}
            if fold:
                row.update(_fold_row(linear, x_test, y_test))
            row["time_s"] = time.perf_counter() - t0
            runs.append(row)
            for layer, module in slopes:
                layers.append({"run": label, "granularity": granularity, "omega": float(omega), "layer": layer,
                               "channels": units[layer], "slopes": module.channels,
                               "nonlinear_fraction": module.nonlinear_fraction()})
            dists += _dist_rows(label, paths)
            history_rows += [{"run": label, "step": i + 1, "loss": v} for i, v in enumerate(history.losses)]
            if cka:
                cka_rows += _cka_rows(label, original, linear, x_test[:cka_samples], site_names, seed, device)
            timings[label] = row["time_s"]

    columns = RUN_COLUMNS + [c for c in (runs[0] if runs else {}) if c not in RUN_COLUMNS]
    runs_frame = pd.DataFrame(runs).reindex(columns=columns)
    tables = {"runs": runs_frame, "layers": pd.DataFrame(layers), "distributions": pd.DataFrame(dists),
              "history": pd.DataFrame(history_rows, columns=["run", "step", "loss"]),
              "matched": matched_napl(runs_frame)}
    if cka:
        tables["cka"] = pd.DataFrame(cka_rows, columns=["run", "layer_a", "layer_b", "linear_cka"])
    summary = {"original_accuracy": original_accuracy, "original_napl": original_paths.napl,
               "runs": runs_frame.to_dict(orient="records"), "original_apl": original_paths.apl,
               "original_distribution": original_paths.distribution.tolist(), "sites": site_names,
               "num_units": int(sum(s.channels for s in sites))}
    timings["total"] = time.perf_counter() - started
    meta = run_meta(model=model_spec, data=data_spec, granularities=list(granularities),
                    omegas=[float(w) for w in omegas], epochs=epochs, lr=lr, slope_lr=slope_lr,
                    batch_size=batch_size, eps=eps, freeze_tol=tol, fold=fold, train_epochs=train_epochs,
                    seed=seed, n_train=len(x), n_test=len(x_test), device=str(device), timings=timings)
    return LinearizeResult(summary=summary, tables=tables, meta=meta)


def _unit_fraction(slopes: list[tuple[str, nn.Module]], units: dict[str, int]) -> float:
    """Fraction of all activation units (channels of every site) still nonlinear (α ≠ 1)."""
    total = sum(units[name] for name, _ in slopes)
    return sum(m.nonlinear_fraction() * units[name] for name, m in slopes) / total


def matched_napl(runs: pd.DataFrame) -> pd.DataFrame:
    """Channel-wise accuracy at each layer-wise run's NAPL, and the difference (channel − layer).

    runs: the runs table. The channel-wise accuracy is interpolated linearly along the channel-wise
    runs sorted by NAPL when the layer-wise NAPL lies within their range, else taken from the nearest
    channel-wise run (``how`` says which). Empty when either granularity is missing.
    """
    columns = ["omega", "napl", "layer_accuracy", "channel_accuracy", "difference", "how"]
    channel = runs[runs["granularity"] == "channel"].sort_values("napl")
    layer = runs[runs["granularity"] == "layer"].sort_values("napl")
    if channel.empty or layer.empty:
        return pd.DataFrame(columns=columns)
    xs, ys = channel["napl"].to_numpy(float), channel["accuracy"].to_numpy(float)
    rows = []
    for _, row in layer.iterrows():
        napl = float(row["napl"])
        if xs[0] <= napl <= xs[-1]:
            acc, how = float(np.interp(napl, xs, ys)), "interpolated"
        else:
            acc, how = float(ys[np.abs(xs - napl).argmin()]), "nearest"
        rows.append({"omega": float(row["omega"]), "napl": napl, "layer_accuracy": float(row["accuracy"]),
                     "channel_accuracy": acc, "difference": acc - float(row["accuracy"]), "how": how})
    return pd.DataFrame(rows, columns=columns)


def _dist_rows(label: str, paths) -> list[dict]:
    length = max(len(paths.distribution), len(paths.apl_distribution))
    dist = np.pad(paths.distribution, (0, length - len(paths.distribution)))
    apl = np.pad(paths.apl_distribution, (0, length - len(paths.apl_distribution)))
    return [{"run": label, "length": k, "probability": float(dist[k]), "apl_probability": float(apl[k])}
            for k in range(length)]


def _fold_row(model: nn.Module, x_test: Tensor, y_test: Tensor) -> dict:
    from simkit.linearization.fold import fold_linear_stretches
    from simkit.training import evaluate_accuracy

    folded = fold_linear_stretches(model)
    return {"depth": folded.depth_before, "folded_depth": folded.depth_after,
            "params": folded.params_before, "folded_params": folded.params_after,
            "folded_accuracy": evaluate_accuracy(folded.model, x_test, y_test)}


def _cka_rows(label: str, original: nn.Module, linear: nn.Module, x: Tensor, sites: list[str],
              seed: int, device: torch.device) -> list[dict]:
    """Linear CKA of every linearized site (b) against every original site (a), long format."""
    from simkit.comparison import compare

    result = compare(copy.deepcopy(original), linear, x, layers_a=sites, layers_b=sites,
                     metrics=["linear_cka"], mode="exact", batch_size=256, seed=seed, progress=False,
                     device=device)
    matrix = result.matrix("linear_cka")
    return [{"run": label, "layer_a": a, "layer_b": b, "linear_cka": float(matrix.loc[a, b])}
            for a in matrix.index for b in matrix.columns]
