"""The over-seed parts of a ``convert`` report: every seed's score beside the mean and its 95 % t
interval, the difference from scratch paired by seed, the ``aggregate`` table, and the budgets of every
arm (labelled-training epochs and optimizer steps) in one table.

Draws only from the result's ``runs``, ``baselines`` and ``aggregate`` tables; the intervals are those
``simkit.conversion`` computed with :mod:`simkit.stats` (Student's t over the per-seed values).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simkit.report.figures import img, new_figure

ARM = ["schedule", "metric", "guide_init", "rank"]
_ROLE_NAMES = {"converted": "converted", "probe": "linear probe", "guide": "guide", "scratch": "scratch",
               "kd": "distillation"}


def _num(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return f"{float(value):.{digits}g}"


def arm_name(row: pd.Series | dict[str, Any]) -> str:
    """``converted · progressive · linear_cka · trained guide · rank 256``, ``scratch``, ``distillation ·
    random guide`` ...: what a row of ``aggregate`` (or ``runs``) is about."""
    role = str(row.get("role", "converted"))
    name = _ROLE_NAMES.get(role, role)
    if role in ("converted", "probe"):
        return f"{name} · {row['schedule']} · {row['metric']} · {row['guide_init']} guide · rank {int(row['rank'])}"
    if role in ("guide", "kd"):
        return f"{name} · {row['guide_init']} guide"
    return name


def _series(runs: pd.DataFrame, score: str) -> list[tuple[str, pd.Series]]:
    """(label, per-seed values indexed by seed) of every converted arm, the scratch and distillation
    baselines and the guides."""
    out: list[tuple[str, pd.Series]] = []
    for key, part in runs.groupby(ARM, sort=False):
        labels = dict(zip(ARM, key, strict=True))
        out.append((arm_name({**labels, "role": "converted"}), part.set_index("seed")[f"converted_{score}"]))
    by_init = runs.drop_duplicates(["seed", "guide_init"])
    for gi, part in by_init.groupby("guide_init", sort=False):
        part = part.set_index("seed")
        out.append((arm_name({"role": "guide", "guide_init": gi}), part[f"guide_{score}"]))
        if f"kd_{score}" in part and part[f"kd_{score}"].notna().any():
            out.append((arm_name({"role": "kd", "guide_init": gi}), part[f"kd_{score}"]))
    first = runs.drop_duplicates("seed").set_index("seed")
    if f"scratch_{score}" in first and first[f"scratch_{score}"].notna().any():
        out.append(("scratch", first[f"scratch_{score}"]))
    return out


def seed_plot(runs: pd.DataFrame, score: str, higher: bool):
    """Left: every seed's test score (dots) beside the mean and its 95 % t interval (bar) for each arm.
    Right: the difference from scratch paired by seed (dots per seed, mean and interval, 0 marked) of every
    converted arm and distillation baseline. None without runs."""
    if runs.empty or "seed" not in runs.columns:
        return None
    series = _series(runs, score)
    gains = _gains(runs, score, higher)
    fig, _ = new_figure(11.0, 0.5 + 0.45 * max(len(series), 3))
    fig.clear()
    axes = fig.subplots(1, 2 if gains else 1, squeeze=False)[0]
    _dots(axes[0], series, f"test {score}: every seed (dots), mean and 95 % t interval")
    if gains:
        _dots(axes[1], gains, "− scratch, paired by seed")
        axes[1].axvline(0.0, color="0.3", lw=0.8, ls="--")
        axes[1].set_yticklabels([])
    fig.subplots_adjust(left=0.32, wspace=0.08)
    return img(fig, f"test {score} per seed and paired differences")


def _gains(runs: pd.DataFrame, score: str, higher: bool) -> list[tuple[str, pd.Series]]:
    """(label, per-seed gain over scratch, in the score's better direction) of every converted arm and
    distillation baseline."""
    if "gain_over_scratch" not in runs.columns or runs["gain_over_scratch"].isna().all():
        return []
    out = [(label, part.set_index("seed")["gain_over_scratch"]) for label, part in
           ((arm_name({**dict(zip(ARM, key, strict=True)), "role": "converted"}), part)
            for key, part in runs.groupby(ARM, sort=False))]
    sign = 1.0 if higher else -1.0
    by_init = runs.drop_duplicates(["seed", "guide_init"])
    for gi, part in by_init.groupby("guide_init", sort=False):
        part = part.set_index("seed")
        if f"kd_{score}" in part and part[f"kd_{score}"].notna().any():
            out.append((arm_name({"role": "kd", "guide_init": gi}),
                        sign * (part[f"kd_{score}"] - part[f"scratch_{score}"])))
    return out


def _dots(ax: Any, series: list[tuple[str, pd.Series]], title: str) -> None:
    """One row per series: its values as dots, the mean as a bar with its 95 % t interval."""
    from simkit.stats import t_interval

    for i, (_, values) in enumerate(series):
        finite = values.astype(float).dropna()
        jitter = np.linspace(-0.12, 0.12, len(finite)) if len(finite) > 1 else np.zeros(len(finite))
        ax.scatter(finite.to_numpy(), i + jitter, s=14, color="C0", zorder=3)
        interval = t_interval(finite.to_numpy())
        if interval.n:
            ax.plot([interval.mean, interval.mean], [i - 0.3, i + 0.3], color="C3", lw=2)
        if interval.n > 1:
            ax.plot([interval.low, interval.high], [i, i], color="C3", lw=1.2, alpha=0.7)
    ax.set_yticks(range(len(series)))
    ax.set_yticklabels([label for label, _ in series], fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="x")


def aggregate_rows(aggregate: pd.DataFrame | None, score: str) -> list[list[str]]:
    """The ``aggregate`` table as text: arm, seeds, mean ± std, 95 % interval, − scratch paired by seed
    with its interval, and whether that interval excludes 0."""
    if aggregate is None or aggregate.empty:
        return []
    out = []
    for _, r in aggregate.iterrows():
        gain = "—"
        if "gain_over_scratch_mean" in r and r["gain_over_scratch_mean"] == r["gain_over_scratch_mean"]:
            gain = (f"{_num(r['gain_over_scratch_mean'])} [{_num(r['gain_over_scratch_low'])}, "
                    f"{_num(r['gain_over_scratch_high'])}]")
            gain += " beyond noise" if bool(r.get("beyond_noise")) else " within noise"
        out.append([arm_name(r), str(int(r["seeds"])),
                    f"{_num(r[f'{score}_mean'])} ± {_num(r[f'{score}_std'])}",
                    f"[{_num(r[f'{score}_low'])}, {_num(r[f'{score}_high'])}]", gain])
    return out


def budget_rows(runs: pd.DataFrame, baselines: pd.DataFrame | None) -> list[list[str]]:
    """Every arm's budget in one table (means over seeds): labelled-training epochs, optimizer steps in
    all, aligning, head, fine-tuning or baseline training, the best validation step, and in how many seeds
    the best epoch was still improving, and why it stopped (plateau, cap, floor or fixed, counted over seeds)."""
    out = []
    for key, part in runs.groupby(ARM, sort=False):
        name = arm_name({**dict(zip(ARM, key, strict=True)), "role": "converted"})
        out.append([name, _num(part["labelled_epochs"].mean()) if "labelled_epochs" in part else "n/a",
                    _num(part["steps"].mean()), _num(part["align_steps"].mean()), _num(part["head_steps"].mean()),
                    _num(part["finetune_steps"].mean()),
                    _num(part["best_step"].mean()) if "best_step" in part else "n/a",
                    _flagged(part.get("still_improving")), _stops(part.get("stopped"))])
    if baselines is not None and not baselines.empty:
        frame = baselines.assign(guide_init=baselines["guide_init"].fillna(""))
        for (kind, gi), part in frame.groupby(["baseline", "guide_init"], sort=False):
            name = "scratch" if kind == "scratch" else arm_name({"role": "kd", "guide_init": gi})
            epochs = _num(part["labelled_epochs"].mean()) if "labelled_epochs" in part else "n/a"
            out.append([name, epochs, _num(part["steps"].mean()), "0", "0", _num(part["steps"].mean()),
                        _num(part["best_step"].mean()), _flagged(part.get("still_improving")),
                        _stops(part.get("stop"))])
    return out


def _stops(values: pd.Series | None) -> str:
    """Why the arm's labelled training stopped, counted over seeds (``plateau 2, cap 1``; ``n/a`` without
    the column, from a run made before the budget rules named their stops)."""
    if values is None or values.dropna().empty:
        return "n/a"
    counts = values.dropna().astype(str).value_counts(sort=False)
    return ", ".join(f"{name} {int(count)}" for name, count in counts.items())


def _flagged(values: pd.Series | None) -> str:
    """``1 of 3 seeds`` (still improving), ``no``, or ``n/a`` without the column."""
    if values is None:
        return "n/a"
    flags = values.fillna(False).astype(bool)
    return f"{int(flags.sum())} of {len(flags)} seeds" if flags.any() else "no"
