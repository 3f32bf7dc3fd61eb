"""The exact-surgery paper's checks (spec §4) as functions returning tidy tables.

E1 bit mismatches of a graft; E2 the three gate arms under SGD; E3 recompute cost against cone size at
every depth; F3 a run grafted mid-way, killed (SIGKILL, in a subprocess) and resumed in a new process.
Every graft runs under ``eval_mode`` (its probe passes change no running statistic); models that
train are put back in train mode after it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from simkit.errors import SimkitError
from simkit.forward import eval_mode
from simkit.grafting.tasks import E1_MIN_VALUES, Task, save_task
from simkit.grafting.verdict import e3_statistics
from simkit.io import save_torch, write_json
from simkit.progress import progress_bar
from simkit.seeding import derive_seed
from simkit.settings.graft import GraftSettings
from simkit.surgery.branches import GatedResidual, MLPBranch
from simkit.surgery.cone import CachedRunner, downstream_cone, find_node, original_target, trace
from simkit.surgery.log import GraftLog
from simkit.surgery.ops import Graft, graft_gated_residual
from simkit.training import (
    MetricsLog,
    TrainConfig,
    TrainHistory,
    build_optimizer,
    checkpoint_path,
    fit,
    load_checkpoint,
    read_graft_log,
)

E2_ARMS = ("shadow", "net2net", "double_zero")
E2_COLUMNS = ("step", "loss", "alpha", "alpha_grad", "branch_max_abs_grad", "branch_norm", "undo_distance")


def float_bits(values: list[float]) -> list[int]:
    """The IEEE-754 float64 bit pattern of each value as an unsigned 64-bit int (for bit-exact comparison)."""
    return [struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in values]


# ---------------------------------------------------------------- E1
def e1_shortfall(values: int, samples: int) -> str | None:
    """The warning when E1 compared fewer output values than the paper's check, else None.

    The probe already holds enough samples for ``E1_MIN_VALUES`` values when the data has them
    (:func:`simkit.grafting.tasks.probe_size`), so a shortfall means the loaded data is too small.
    """
    if values >= E1_MIN_VALUES:
        return None
    return (f"E1 compared only {values} output values ({samples} probe samples), fewer than the "
            f"{E1_MIN_VALUES} of the paper's check, so 0 mismatches is weaker evidence of a bit-exact graft; "
            "the probe holds every loaded sample, so load more samples: raise `n` (--n) or give a larger dataset")


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` inside the block, restored after it.

    The suite's models are small: on a 2-core machine one thread per process trains several times
    faster (in CPU seconds) than two, whose synchronisation costs more than the split saves, and F3
    runs two processes side by side.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def graft_in_eval_mode(model: nn.Module, *args: Any, **kwargs: Any) -> Graft:
    """:func:`simkit.surgery.graft_gated_residual` with the probe passes in eval mode (modes kept)."""
    with eval_mode(model):
        return graft_gated_residual(model, *args, **kwargs)


def run_e1(task: Task, s: GraftSettings) -> pd.DataFrame:
    """Graft with each gate (shadow, net2net) on a fresh model; bits of the outputs before vs after.

    Warns (RuntimeWarning, :func:`e1_shortfall`) when fewer than ``E1_MIN_VALUES`` values were compared.
    """
    after, branch = s.site()
    rows: list[dict[str, Any]] = []
    gates = ("shadow", "net2net") + ((s.gate,) if s.gate not in ("shadow", "net2net") else ())
    for gate in gates:
        model = task.make_model()
        g = graft_in_eval_mode(model, after, branch, gate, probe=task.probe, seed=s.seed,
                               allow_double_zero=s.allow_double_zero)
        rows.append({"gate": gate, "after": after, "branch": branch, "values_compared": g.values_compared,
                     "mismatches": g.mismatches, "site_mismatches": g.site_mismatches,
                     **g.preconditions, "bookkeeping_s": g.bookkeeping_s})
    note = e1_shortfall(min(int(r["values_compared"]) for r in rows), probe_rows(task.probe))
    if note:
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    return pd.DataFrame(rows)


def probe_rows(probe: Any) -> int:
    """Samples in a probe batch (a tensor (b, ...) or a tuple whose first item is one)."""
    first = probe[0] if isinstance(probe, tuple) else probe
    return int(first.shape[0]) if isinstance(first, torch.Tensor) else 0


# ---------------------------------------------------------------- E2
def _first_nonzero(frame: pd.DataFrame, column: str) -> int | None:
    hit = frame.loc[frame[column] != 0, "step"]
    return int(hit.iloc[0]) if len(hit) else None


def run_e2_arm(task: Task, s: GraftSettings, arm: str, run_dir: Path | None, resume: bool) -> pd.DataFrame:
    """Train the whole model with plain SGD after a graft with gate ``arm``; one row per step.

    Each row is written right after its optimizer step (a step post-hook), before ``fit`` can write
    that step's checkpoint, so a run killed at any moment resumes with every row up to its checkpoint.
    """
    after, branch = s.site()
    model = task.make_model().train()
    cfg = TrainConfig(steps=s.steps, batch_size=s.batch_size, lr=s.e2_lr, optimizer="sgd", momentum=0.0,
                      seed=s.seed, checkpoint_every=max(1, s.steps // 5), progress=task.progress,
                      description=f"E2 {arm}")
    opt = build_optimizer(model.parameters(), cfg)
    g = graft_in_eval_mode(model, after, branch, arm, probe=task.probe, seed=s.seed, optimizer=opt,
                           allow_double_zero=True)
    model.train()  # the gate too (it took the eval mode of its site during the graft)
    gate, name = g.gate, f"e2_{arm}"
    seen: dict[str, Any] = {}

    def remember(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:  # α and ‖R(x)‖ of this step
        seen["alpha"] = float(gate.alpha.detach())
        seen["norm"] = float(output.detach().flatten(1).double().norm(dim=1).mean())

    done = 0
    if resume and run_dir is not None and checkpoint_path(run_dir, name).is_file():
        done = int(load_checkpoint(checkpoint_path(run_dir, name))["step"])
    rows_path = None if run_dir is None else Path(run_dir) / f"{name}.rows.csv"
    rows = MetricsLog(rows_path, keep_until=done if done else None, columns=E2_COLUMNS)
    memory: list[list[float]] = []

    branch_params = list(gate.branch.parameters())
    base_loss = task.loss(model)
    steps_done = [done]

    def loss_fn(batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        seen["loss"] = loss = base_loss(batch)
        return loss

    def record(optimizer: Any, args: Any, kwargs: Any) -> None:  # after the step's update; its grads are kept
        steps_done[0] += 1
        grads = [p.grad.abs().max() for p in branch_params if p.grad is not None]
        grad = float(torch.stack(grads).max()) if grads else 0.0
        agrad = float(gate.alpha.grad.abs()) if gate.alpha.grad is not None else 0.0
        loss = float(seen["loss"].detach().double())  # the value fit records for the step
        values = [loss, seen["alpha"], agrad, grad, seen["norm"], abs(seen["alpha"]) * seen["norm"]]
        rows.write(steps_done[0], *values)
        memory.append([steps_done[0], *values])

    handles = [gate.branch.register_forward_hook(remember), opt.register_step_post_hook(record)]
    try:
        fit(model, loss_fn, task.data, cfg, optimizer=opt, run_dir=run_dir, name=name, resume=resume)
    finally:
        for handle in handles:
            handle.remove()
        rows.close()
    if rows_path is not None:
        frame = pd.read_csv(rows_path)
    else:
        frame = pd.DataFrame(memory, columns=list(E2_COLUMNS))
    frame.insert(0, "arm", arm)
    return frame


def e2_arms_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per arm: first steps with non-zero gradients, largest gradients, final α and loss."""
    rows = []
    for arm, part in frame.groupby("arm", sort=False):
        rows.append({"arm": arm, "alpha_first_grad_step": _first_nonzero(part, "alpha_grad"),
                     "branch_first_grad_step": _first_nonzero(part, "branch_max_abs_grad"),
                     "max_abs_alpha_grad": float(part["alpha_grad"].max()),
                     "max_abs_branch_grad": float(part["branch_max_abs_grad"].max()),
                     "final_alpha": float(part["alpha"].iloc[-1]),
                     "final_undo_distance": float(part["undo_distance"].iloc[-1]),
                     "final_loss": float(part["loss"].iloc[-1])})
    return pd.DataFrame(rows)


def run_e2(task: Task, s: GraftSettings, run_dir: Path | None,
           resume: bool) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The three arms: (per-step table, per-arm table, summary)."""
    frame = pd.concat([run_e2_arm(task, s, arm, run_dir, resume) for arm in E2_ARMS], ignore_index=True)
    arm = {a: frame[frame["arm"] == a] for a in E2_ARMS}
    dz = arm["double_zero"]
    summary = {
        "e2_shadow_alpha_first_grad_step": _first_nonzero(arm["shadow"], "alpha_grad"),
        "e2_shadow_branch_first_grad_step": _first_nonzero(arm["shadow"], "branch_max_abs_grad"),
        "e2_net2net_alpha_first_grad_step": _first_nonzero(arm["net2net"], "alpha_grad"),
        "e2_net2net_branch_first_grad_step": _first_nonzero(arm["net2net"], "branch_max_abs_grad"),
        "e2_double_zero_max_abs_grad": float(max(dz["alpha_grad"].max(), dz["branch_max_abs_grad"].max())),
        "e2_steps": int(s.steps),
    }
    return frame, e2_arms_table(frame), summary


# ---------------------------------------------------------------- E3
def e3_sites(model: nn.Module, s: GraftSettings, builtin: bool) -> tuple[list[str], list[str]]:
    """(graft sites in depth order, leaf modules for tracing)."""
    blocks = getattr(model, "blocks", None)
    if builtin and isinstance(blocks, nn.ModuleList):
        sites = ["embed"] + [f"blocks.{i}" for i in range(len(blocks))]
        return sites, sites
    gm = trace(model)
    names = [original_target(gm, n.target) for n in gm.graph.nodes if n.op == "call_module"]  # the model's names
    names = list(dict.fromkeys(n for n in names if names.count(n) == 1))
    if len(names) > s.max_e3_sites:
        pick = np.linspace(0, len(names) - 1, s.max_e3_sites).round().astype(int)
        names = [names[i] for i in sorted(set(pick))]
    return names, []


E3_REPEATS = 5  # timed calls per measurement (after one untimed warm-up call); the fastest counts


def _best_time(fn: Callable[[], Any], repeats: int = E3_REPEATS) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn``, after one untimed warm-up call (the first
    call of a freshly built graph pays for allocations and caches the later ones do not)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@torch.no_grad()
def run_e3(task: Task, s: GraftSettings) -> tuple[pd.DataFrame, dict[str, Any]]:
    """At every depth: graft a shadow-gated pre-norm MLP, recompute only the cone, time it; the summary
    adds the correlation's interval and the bookkeeping slope against depth (``e3_statistics``)."""
    model = task.make_model()
    try:
        sites, leaves = e3_sites(model, s, task.builtin)
    except SimkitError as exc:
        return pd.DataFrame(), {"e3_cone_cost_correlation": float("nan"), "e3_note": str(exc)}
    full_s = _best_time(lambda: model(task.probe))
    rows = []
    with progress_bar(task.progress) as bar:
        job = bar.add_task("E3 graft depths", total=len(sites))
        for depth, site in enumerate(sites):
            row = _e3_site(task, s, leaves, depth, site, full_s)
            if row is not None:
                rows.append(row)
            bar.advance(job)
    frame = pd.DataFrame(rows)
    corr = float("nan")
    if len(frame) >= 3 and frame["cone_nodes"].nunique() > 1:
        corr = float(np.corrcoef(frame["cone_nodes"], frame["recompute_s"])[0, 1])
    judged = e3_statistics(frame["depth"], frame["cone_nodes"], frame["recompute_s"],
                           frame["bookkeeping_s"]) if len(frame) else {}
    return frame, {"e3_cone_cost_correlation": corr, "e3_sites": len(frame), **judged}


def _e3_site(task: Task, s: GraftSettings, leaves: list[str], depth: int, site: str,
             full_s: float) -> dict[str, Any] | None:
    """One E3 row: graft a shadow-gated MLP after ``site`` in a traced copy and time the recompute of
    the graft and its cone (None when the site's output is not a floating-point stream (b, ..., d))."""
    runner = CachedRunner(trace(task.make_model(), leaves=leaves))
    runner.run(task.probe)
    stream = runner.cache[find_node(runner.gm, site).name]
    if not (isinstance(stream, torch.Tensor) and stream.is_floating_point() and stream.ndim >= 2):
        return None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        gate = GatedResidual(MLPBranch(stream.shape[-1]), alpha=0.0, dtype=stream.dtype)
    new = runner.graft(site, gate, f"e3_graft_{depth}")
    cone = downstream_cone(runner.gm, new)

    def rerun() -> None:
        runner.dirty = {new.name}
        runner.run(task.probe)

    recompute_s = _best_time(rerun)
    if len(runner.recomputed) != 1 + len(cone):
        raise RuntimeError(f"cached runner recomputed {len(runner.recomputed)} nodes, cone has {len(cone) + 1}")
    g = graft_in_eval_mode(task.make_model(), site, "mlp", "shadow", probe=task.probe, seed=s.seed)
    return {"depth": depth, "site": site, "cone_nodes": len(cone) + 1,
            "graph_nodes": sum(1 for n in runner.gm.graph.nodes if n.op != "placeholder"),
            "recompute_s": recompute_s, "full_forward_s": full_s, "bookkeeping_s": g.bookkeeping_s,
            "mismatches": g.mismatches}


# ---------------------------------------------------------------- F3
def f3_configs(s: GraftSettings, progress: bool = False,
               label: str = "F3") -> tuple[TrainConfig, TrainConfig, int]:
    """Stage configs (before / after the graft; ``label`` heads their progress bars) and the stage-2
    step at which the worker hangs.

    The graft comes half-way, but stage 2 keeps at least 4 steps: the worker is killed after a step
    that is not a checkpoint, and the resume from the checkpoint before it must leave two steps, since
    dropping the moments changes the update of the first one and so only the loss of the second.
    """
    s1 = min(s.steps // 2, s.steps - 4)
    s2 = s.steps - s1
    every = max(2, s2 // 4)
    cfg1 = TrainConfig(steps=s1, batch_size=s.batch_size, lr=s.f3_lr, optimizer="adamw", seed=s.seed,
                       checkpoint_every=every, progress=progress, description=f"{label} before graft")
    cfg2 = replace(cfg1, steps=s2, seed=derive_seed(s.seed, "f3_stage2"), description=f"{label} after graft")
    hang = s2 // 2 + 1
    if hang % every == 0:
        hang += 1
    return cfg1, cfg2, min(hang, s2 - 1)


def run_f3_training(task: Task, s: GraftSettings, run_dir: Path, *, resume: bool,
                    hang_at: int | None = None, label: str = "F3") -> list[float]:
    """Train cfg1 steps, graft (logged, new params join the AdamW optimizer), train cfg2 steps.

    Resuming after the graft rebuilds the architecture by replaying the graft log stored in the
    stage-2 checkpoint; ``hang_at`` (worker only) blocks at that stage-2 step so it can be killed.
    """
    after, branch = s.site()
    cfg1, cfg2, _ = f3_configs(s, task.progress, label)
    model = task.make_model().train()
    opt = build_optimizer(model.parameters(), cfg1)
    stage2 = checkpoint_path(run_dir, "f3_stage2")
    if resume and stage2.is_file():
        log = GraftLog(read_graft_log(run_dir, "f3_stage2"))
        log.replay(model, opt)
        model.train()
        h1 = TrainHistory.from_dict(load_checkpoint(checkpoint_path(run_dir, "f3_stage1"))["history"])
    else:
        h1 = fit(model, task.loss(model), task.data, cfg1, optimizer=opt, run_dir=run_dir, name="f3_stage1",
                 resume=resume)
        log = GraftLog()
        graft_in_eval_mode(model, after, branch, s.gate, probe=task.probe, seed=s.seed, optimizer=opt, log=log,
                           allow_double_zero=s.allow_double_zero)
        model.train()

    def hang(step: int, loss: float) -> None:
        if step == hang_at:
            (run_dir / "f3_reached").write_text(str(step))
            time.sleep(3600)

    h2 = fit(model, task.loss(model), task.data, cfg2, optimizer=opt, run_dir=run_dir, name="f3_stage2",
             resume=resume, graft_log=log, callback=hang if hang_at else None)
    return h1.losses + h2.losses


def _worker(run_dir: Path, inputs: Path, mode: str, threads: int,
            hang_at: int | None = None) -> subprocess.Popen[bytes]:
    """A worker process (:mod:`simkit.grafting.f3_worker`) with ``threads`` torch threads."""
    cmd = [sys.executable, "-m", "simkit.grafting.f3_worker", str(inputs), str(run_dir), mode]
    if hang_at is not None:
        cmd.append(str(hang_at))
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})


def _stderr(process: subprocess.Popen[bytes]) -> str:
    return process.stderr.read().decode()[-2000:] if process.stderr is not None else ""


def _drop_moments(path: Path) -> None:
    data = load_checkpoint(path)
    data["optimizer"]["state"] = {}
    save_torch(path, data)


def run_f3(task: Task, s: GraftSettings, out: Path, timeout: float = 1800.0) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Uninterrupted run (in process) vs a run killed by SIGKILL in a subprocess and resumed in another;
    then the same resume with the optimizer moments dropped.

    The worker processes rebuild the task from ``<out>/f3/inputs/``: the settings, the initial model
    and the data tensors (:func:`simkit.grafting.tasks.save_task`). Each worker runs while this process
    trains (the killed one beside the uninterrupted run, the resuming one beside the run without
    moments), so F3 takes about the time of the uninterrupted run on two cores.
    """
    root = out / "f3"
    if root.exists():
        shutil.rmtree(root)  # F3 is about interruption itself: always redone from scratch
    full_dir, cut_dir, bare_dir, inputs = root / "full", root / "killed", root / "no_moments", root / "inputs"
    for d in (full_dir, cut_dir, inputs):
        d.mkdir(parents=True)
    write_json(inputs / "settings.json", s.to_dict())
    save_task(task, inputs)
    cfg1, _, hang_at = f3_configs(s)
    s1 = int(cfg1.steps or 0)
    worker = _worker(cut_dir, inputs, "fresh", s.threads, hang_at)
    try:
        full = run_f3_training(task, s, full_dir, resume=False)
        deadline = time.time() + timeout
        while not (cut_dir / "f3_reached").exists():
            if worker.poll() is not None:
                raise RuntimeError(f"F3 worker exited early: {_stderr(worker)}")
            if time.time() > deadline:
                raise RuntimeError("F3 worker did not reach the kill point in time")
            time.sleep(0.05)
    except BaseException:  # Ctrl-C, an error: no worker is left behind, sleeping at its kill point
        worker.kill()
        worker.wait()
        raise
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    if worker.stderr is not None:
        worker.stderr.close()
    ckpt = load_checkpoint(checkpoint_path(cut_dir, "f3_stage2"))
    resumed_from = s1 + int(ckpt["step"])
    shutil.copytree(cut_dir, bare_dir)
    _drop_moments(checkpoint_path(bare_dir, "f3_stage2"))
    resumer = _worker(cut_dir, inputs, "resume", s.threads)
    try:
        bare = run_f3_training(task, s, bare_dir, resume=True, label="F3 without moments,")
    except BaseException:
        resumer.kill()
        resumer.wait()
        raise
    _, err = resumer.communicate(timeout=timeout)
    if resumer.returncode != 0:
        raise RuntimeError(f"F3 resume worker failed: {err.decode()[-2000:]}")
    resumed = json.loads((cut_dir / "f3_losses.json").read_text())
    identical = float_bits(resumed) == float_bits(full)
    diverge = next((i + 1 for i, (a, b) in enumerate(zip(float_bits(full), float_bits(bare), strict=True))
                    if a != b), None)
    frame = pd.DataFrame({"step": range(1, len(full) + 1), "loss_uninterrupted": full,
                          "loss_killed_resumed": resumed, "loss_resumed_without_moments": bare})
    summary = {"f3_resume_bit_identical": identical, "f3_without_moments_diverges_at_step": diverge,
               "f3_graft_at_step": s1, "f3_killed_after_step": s1 + hang_at,
               "f3_resumed_from_step": resumed_from}
    return frame, summary
