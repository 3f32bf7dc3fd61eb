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
import time
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
from simkit.forward import check_accepts, eval_mode, modes_kept, resolve_device
from simkit.linearization.fold import fold_linear_stretches
from simkit.linearization.napl import PathLengths, path_lengths
from simkit.linearization.prelu import explicit_relus, site_channels, swap_relus
from simkit.linearization.settings import LinearizeSettings
from simkit.linearization.slope import FREEZE_TOL, FreezeRule, SlopeReLU, slope_modules, slope_penalty
from simkit.results import LinearizeResult
from simkit.rundir import RunDir, fingerprint, open_run_dir
from simkit.runinfo import run_meta
from simkit.surgery import bit_mismatches
from simkit.training import TrainConfig, TrainHistory, evaluate_accuracy, fit, train_classifier

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
               progress: bool = False, callback: Callable[[int, float], None] | None = None) -> TrainHistory:
    """Post-train a swapped model with CE + ω·penalty under the freeze rule; returns the TrainHistory.

    x: (n, ...) inputs, y: (n,) labels. Slopes get their own learning rate and no weight decay.
    run_dir / name: where the training loop checkpoints (``<run_dir>/checkpoints/<name>.pt``; None: no
    files). The model is in train mode while training and in eval mode afterwards.
    callback(step, loss) runs after every step (after the freeze rule), as in :func:`fit`.
    """
    slopes = [m for _, m in slope_modules(model)]
    alpha_ids = {id(m.alpha) for m in slopes}
    weights = [p for p in model.parameters() if p.requires_grad and id(p) not in alpha_ids]
    optimizer = torch.optim.AdamW([{"params": weights, "lr": lr, "weight_decay": 0.0},
                                   {"params": [m.alpha for m in slopes], "lr": slope_lr, "weight_decay": 0.0}])
    config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
                         description=name)

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


def _stage_name(granularity: str, omega: float) -> str:
    """Checkpoint name of one run: ``linearize_channel_w0.001`` (unchanged for ω that ``%g`` spells
    exactly, so older run directories still resume; exact text otherwise, see :func:`omega_text`)."""
    return f"linearize_{granularity}_w{omega_text(omega)}"


def linearize(model: nn.Module, data: Dataset, settings: LinearizeSettings | None = None, *,
              run_dir: RunDir | str | Path | None = None, resume: bool = False,
              device: str | torch.device = "cpu", progress: bool = True, model_name: str | None = None,
              data_name: str | None = None) -> LinearizeResult:
    """Linearize a trained ReLU network over granularities × ω values (see ``LinearizeSettings``).

    model: a classifier (N, ...) → logits (N, classes) that torch.fx can trace; it is not changed
        unless ``settings.train`` > 0 (then it is trained first, as stage ``pretrain``); its modules'
        train/eval flags are restored on return.
    data: a labelled ``simkit.data.Dataset`` with tensor inputs (its native test split, else an 80/20
        split seeded by ``settings.seed``).
    run_dir: where checkpoints go (None: nowhere): a ``simkit.RunDir`` as it is, or a path checked
        against these settings and fingerprints of ``model`` and ``data``, so ``resume=True`` (skip
        finished runs, continue an interrupted one) refuses other inputs. Nothing is written there
        before every input is validated.
    device: ``cpu``, ``cuda`` or ``cuda:N``; the model is moved there (and stays there), with the data,
        the swapped copies and all losses.
    model_name / data_name: what ``meta`` calls them (default: the model's class name, ``data.spec``).
    Returns a LinearizeResult (see its docstring for the tables).
    """
    started = time.perf_counter()
    settings = settings if settings is not None else LinearizeSettings()
    settings.validate()
    device = resolve_device(device)
    if isinstance(data, Dataset):
        check_finite(data)
    train, tensors = _labelled(data, settings.seed)
    inputs = _inputs(settings, model, data) if isinstance(run_dir, str | Path) else {}
    x, y, x_test, y_test = (t.to(device) for t in tensors)
    with modes_kept(model):
        model.to(device)
        explicit_relus(model)   # fail early: untraceable or no ReLU
        with eval_mode(model):
            check_accepts(model, x[:2], "the model")
        opened = open_run_dir(run_dir, "linearize", inputs, resume=resume)
        if opened is not None:
            opened.start()
        return _sweep(model, settings, train, (x, y, x_test, y_test), opened, device, progress, started,
                      model_name=type(model).__name__ if model_name is None else model_name,
                      data_name=data.spec if data_name is None else data_name)


def _inputs(settings: LinearizeSettings, model: nn.Module, data: Dataset) -> dict[str, Any]:
    """What a Python caller's run directory is tied to: the settings, and fingerprints of the model as
    given (before any training) and of the data (its test split included)."""
    return {**settings.to_dict(), "model": fingerprint(model), "data": fingerprint(data)}


def _sweep(model: nn.Module, s: LinearizeSettings, train: Dataset, tensors: tuple[Tensor, Tensor, Tensor, Tensor],
           rundir: RunDir | None, device: torch.device, progress: bool, started: float, *,
           model_name: str, data_name: str) -> LinearizeResult:
    """The sweep itself, once every input is validated and the run directory started. train: the
    training split (CPU); tensors: (x, y, x_test, y_test) on ``device``."""
    x, y, x_test, y_test = tensors
    run_dir = rundir.path if rundir is not None else None
    resume = rundir.resume if rundir is not None else False
    granularities, omegas = s.granularities(), s.omegas()
    timings: dict[str, float] = {}
    if s.train > 0:
        t0 = time.perf_counter()
        config = TrainConfig(epochs=s.train, batch_size=s.batch_size, lr=s.lr, seed=s.seed, progress=progress,
                             description="pretrain")
        train_classifier(model, train, config, run_dir=run_dir, name="pretrain", resume=resume)
        timings["pretrain"] = time.perf_counter() - t0
    model.eval()
    original, sites = explicit_relus(model)
    original.eval()
    site_channels(original, sites, x[:2])
    example = x[: min(len(x), 8)]
    original_accuracy = evaluate_accuracy(model, x_test, y_test)
    original_paths = path_lengths(original, example)
    site_names = [site.name for site in sites]
    units = {site.name: site.channels for site in sites}      # channels of each site, whatever the granularity

    runs: list[dict[str, Any]] = []
    layers: list[dict[str, Any]] = []
    cka_rows: list[dict[str, Any]] = []
    history_rows: list[dict[str, Any]] = []
    dists = _dist_rows("original", original_paths)
    for granularity in granularities:
        for omega in omegas:
            label, name = run_label(granularity, omega), _stage_name(granularity, omega)
            t0 = time.perf_counter()
            linear, _ = swap_relus(model, granularity, example)
            exact = _bit_exact(model, linear, x_test[:256])
            history = post_train(linear, x, y, omega=omega, epochs=s.epochs, lr=s.lr, slope_lr=s.slope_lr,
                                 batch_size=s.batch_size, eps=s.eps, tol=s.freeze_tol, seed=s.seed,
                                 run_dir=run_dir, name=name, resume=resume, progress=progress)
            accuracy = evaluate_accuracy(linear, x_test, y_test)
            paths = path_lengths(linear, example)
            slopes = list(slope_modules(linear))
            alphas = torch.cat([m.effective_alpha().detach() for _, m in slopes])
            row: dict[str, Any] = {
                "granularity": granularity, "omega": omega, "napl": paths.napl,
                "nonlinear_fraction": _unit_fraction(slopes, units), "accuracy": accuracy, "apl": paths.apl,
                "active_layers": sum(m.nonlinear_fraction() > 0 for _, m in slopes),
                "frozen_fraction": float(torch.cat([m.frozen for _, m in slopes]).float().mean()),
                "mean_alpha": float(alphas.mean()), "bit_exact_at_start": exact,
                "final_loss": history.losses[-1] if history.losses else float("nan"),
                "steps": history.steps}
            if s.fold:
                row.update(_fold_row(linear, x_test, y_test))
            row["time_s"] = time.perf_counter() - t0
            runs.append(row)
            for layer, module in slopes:
                layers.append({"run": label, "granularity": granularity, "omega": omega, "layer": layer,
                               "channels": units[layer], "slopes": module.channels,
                               "nonlinear_fraction": module.nonlinear_fraction()})
            dists += _dist_rows(label, paths)
            history_rows += [{"run": label, "step": i + 1, "loss": v} for i, v in enumerate(history.losses)]
            if s.cka:
                cka_rows += _cka_rows(label, original, linear, x_test[:s.cka_samples], site_names, s.seed, device)
            timings[label] = row["time_s"]

    columns = RUN_COLUMNS + [c for c in (runs[0] if runs else {}) if c not in RUN_COLUMNS]
    runs_frame = pd.DataFrame(runs).reindex(columns=columns)
    tables = {"runs": runs_frame, "layers": pd.DataFrame(layers), "distributions": pd.DataFrame(dists),
              "history": pd.DataFrame(history_rows, columns=["run", "step", "loss"]),
              "matched": matched_napl(runs_frame)}
    if s.cka:
        tables["cka"] = pd.DataFrame(cka_rows, columns=["run", "layer_a", "layer_b", "linear_cka"])
    summary = {"original_accuracy": original_accuracy, "original_napl": original_paths.napl,
               "runs": runs_frame.to_dict(orient="records"), "original_apl": original_paths.apl,
               "original_distribution": original_paths.distribution.tolist(), "sites": site_names,
               "num_units": int(sum(site.channels for site in sites))}
    timings["total"] = time.perf_counter() - started
    meta = run_meta(model=model_name, data=data_name, granularities=granularities, omegas=omegas,
                    epochs=s.epochs, lr=s.lr, slope_lr=s.slope_lr, batch_size=s.batch_size, eps=s.eps,
                    freeze_tol=s.freeze_tol, fold=s.fold, train_epochs=s.train, seed=s.seed, n_train=len(x),
                    n_test=len(x_test), device=str(device), settings=s.to_dict(), timings=timings)
    return LinearizeResult(summary=summary, tables=tables, meta=meta)


def _unit_fraction(slopes: Sequence[tuple[str, SlopeReLU]], units: dict[str, int]) -> float:
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


def _dist_rows(label: str, paths: PathLengths) -> list[dict[str, Any]]:
    length = max(len(paths.distribution), len(paths.apl_distribution))
    dist = np.pad(paths.distribution, (0, length - len(paths.distribution)))
    apl = np.pad(paths.apl_distribution, (0, length - len(paths.apl_distribution)))
    return [{"run": label, "length": k, "probability": float(dist[k]), "apl_probability": float(apl[k])}
            for k in range(length)]


def _fold_row(model: nn.Module, x_test: Tensor, y_test: Tensor) -> dict[str, Any]:
    folded = fold_linear_stretches(model)
    return {"depth": folded.depth_before, "folded_depth": folded.depth_after,
            "params": folded.params_before, "folded_params": folded.params_after,
            "folded_accuracy": evaluate_accuracy(folded.model, x_test, y_test)}


def _cka_rows(label: str, original: nn.Module, linear: nn.Module, x: Tensor, sites: list[str],
              seed: int, device: torch.device) -> list[dict[str, Any]]:
    """Linear CKA of every linearized site (b) against every original site (a), long format."""
    result = compare(copy.deepcopy(original), linear, x, layers_a=sites, layers_b=sites,
                     metrics=["linear_cka"], mode="exact", batch_size=256, seed=seed, progress=False,
                     device=device)
    matrix = result.matrix("linear_cka")
    return [{"run": label, "layer_a": a, "layer_b": b, "linear_cka": float(matrix.loc[a, b])}
            for a in matrix.index for b in matrix.columns]
