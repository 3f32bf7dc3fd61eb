"""Shared by ``theseus_vit.py`` and ``theseus_deep_to_shallow.py``: one conversion arm and its
target-from-scratch baseline over several seeds (one ``simkit.convert`` call per seed), then the
mean ± spread table as Markdown.

Not an example of its own: the two scripts hold the experiment designs and call :func:`run_seeds`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

import simkit
from simkit.data import Dataset
from simkit.models import load_model


def load_average() -> str:
    """The 1/5/15-minute load averages, e.g. ``"2.10 1.95 1.40"``."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def run_seeds(guide_spec: str, data: Dataset, data_name: str,
              settings_for: Callable[[int], simkit.ConvertSettings], seeds: list[int], out: Path, *,
              resume: bool = False, report: bool = True) -> pd.DataFrame:
    """One row per seed: the run's summary (scores, steps), the scratch baseline's stopping record,
    parameter counts, wall seconds and the load average before and after. Run directories (result,
    tables, report.html, checkpoints) go to ``out/seed<S>``; ``resume`` continues those that exist."""
    rows = []
    for seed in seeds:
        run_dir = out / f"seed{seed}"
        guide = load_model(guide_spec, seed=seed)
        guide_params = sum(p.numel() for p in guide.parameters())
        load_before, start = load_average(), time.perf_counter()
        result = simkit.convert(guide, data, settings_for(seed), run_dir=run_dir, resume=resume and run_dir.exists(),
                                guide_name=guide_spec, data_name=data_name)
        seconds = time.perf_counter() - start
        simkit.save_run(result, run_dir, report=report)
        slots = result.extra["slots"]
        row = {"seed": seed, **{k: v for k, v in result.summary.items() if not isinstance(v, dict | list)},
               "guide_params": guide_params,
               "target_params": guide_params - sum(s["guide_params"] for s in slots)
               + sum(s["target_params"] for s in slots),
               "seconds": round(seconds, 1), "load_before": load_before, "load_after": load_average()}
        baselines = result.tables.get("baselines")
        if baselines is not None and len(baselines):
            scratch = baselines[baselines["baseline"] == "scratch"].iloc[0]
            row.update({"scratch_stopped": scratch.get("stopped"), "scratch_best_step": scratch.get("best_step"),
                        "scratch_min_steps": scratch.get("min_steps"),
                        "scratch_still_improving": scratch.get("still_improving")})
        rows.append(row)
        print(f"seed {seed}: guide {row['guide_accuracy']:.4f}  converted {row['converted_accuracy']:.4f}  "
              f"probe {row['probe_accuracy']:.4f}  scratch {row.get('scratch_accuracy', float('nan')):.4f}  "
              f"({seconds:.0f} s, load {row['load_before']} → {row['load_after']})", flush=True)
    return pd.DataFrame(rows)


def _spread(values: pd.Series, scale: float) -> str:
    """``mean ± sd [min, max]`` (sample standard deviation over seeds) in ``scale`` units."""
    v = values.astype(float) * scale
    sd = f" ± {v.std(ddof=1):.1f}" if len(v) > 1 else ""
    return f"{v.mean():.1f}{sd} [{v.min():.1f}, {v.max():.1f}]"


def markdown(title: str, rows: pd.DataFrame, labels: dict[str, str], settings: simkit.ConvertSettings,
             command: str, wall_seconds: float) -> str:
    """The results note: scores (mean ± sd [min, max] over seeds, then every seed), steps, time, load.

    labels: what to call ``guide``, ``converted``, ``probe`` and ``scratch`` in the table."""
    seeds = rows["seed"].tolist()
    lines = [f"# {title}", "", f"Command: `{command}`", "",
             f"Seeds {seeds}; wall time {wall_seconds:.0f} s in all "
             f"({rows['seconds'].mean():.0f} s per seed on 2 shared CPU cores, load average at the start of "
             f"each seed: {', '.join(rows['load_before'])}).", "",
             "| model | test accuracy (%), mean ± sd [min, max] | per seed |", "|---|---|---|"]
    for key in ("guide", "converted", "probe", "scratch"):
        column = f"{key}_accuracy"
        if column in rows and rows[column].notna().all():
            per_seed = ", ".join(f"{100 * v:.1f}" for v in rows[column])
            lines.append(f"| {labels[key]} | {_spread(rows[column], 100)} | {per_seed} |")
    if "gain_over_scratch" in rows and rows["gain_over_scratch"].notna().all():
        per_seed = ", ".join(f"{100 * v:+.1f}" for v in rows["gain_over_scratch"])
        lines.append(f"| gain: converted − scratch (points) | {_spread(rows['gain_over_scratch'], 100)} | "
                     f"{per_seed} |")
    lines += ["", "| seed | guide steps | converted steps (align) | scratch steps (best step, minimum, stop, still improving) | "
                  "guide params | target params | seconds |", "|---|---|---|---|---|---|---|"]
    for _, r in rows.iterrows():
        scratch = (f"{r.get('scratch_steps')} ({r.get('scratch_best_step')}, {r.get('scratch_min_steps')}, "
                   f"{r.get('scratch_stopped')}, {r.get('scratch_still_improving')})")
        lines.append(f"| {r['seed']} | {r.get('guide_steps')} | {r.get('converted_steps')} ({r.get('align_steps')}) "
                     f"| {scratch} | {r['guide_params']} | {r['target_params']} | {r['seconds']:.0f} |")
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    if "gain_over_scratch" in rows and rows["gain_over_scratch"].notna().all():
        gain = rows["gain_over_scratch"].astype(float)
        lines.append(f"| converted > {labels['scratch']} (the paper's row) | {_spread(gain, 100)} points; "
                     f"{int((gain > 0).sum())} of {len(gain)} seeds positive | "
                     f"{'met' if gain.mean() > 0 else 'not met'} |")
    lines.append(f"| {len(seeds)} seeds within 20 min on 2 shared cores | {wall_seconds / 60:.1f} min | "
                 f"{'met' if wall_seconds <= 1200 else 'not met'} |")
    recorded = {k: v for k, v in settings.to_dict().items() if k != "seed"}
    lines += ["", "Settings (`simkit.ConvertSettings`, seed varies): "
              + ", ".join(f"`{k}={v}`" for k, v in recorded.items()), ""]
    return "\n".join(lines)
