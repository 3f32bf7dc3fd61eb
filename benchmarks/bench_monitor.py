"""What ``simkit.Monitor`` costs a training loop (issue #42 target: ≤ 5 % at every=100, 512-sample probe).

The built-in small CNN (``simkit:cnn1d``) trained on MNIST-1D with Adam (batch 128) for ``--steps`` steps,
with and without a monitor (unbiased CKA against the first measured step, every ``--every`` steps, on a
512-sample probe), alternating the two arms ``--repeats`` times in one process; reports the median ratio
of wall and CPU time. Run by hand on an idle machine (load under 1) and name the CPU:

    python benchmarks/bench_monitor.py --steps 1000 --every 100 --repeats 3

The time inside ``monitor.step`` (the measurements) and inside ``monitor.close`` (the final tables, report
and figures: a fixed cost per run) are also given as shares of the bare run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import simkit
from simkit.data import load_data
from simkit.models import load_model


def train(steps: int, every: int | None, x: torch.Tensor, y: torch.Tensor, probe: torch.Tensor,
          report: bool) -> tuple[float, float, float, float]:
    """(wall s, CPU s, seconds inside ``monitor.step``, seconds in ``monitor.close``) of ``steps`` training
    steps, with a monitor every ``every`` steps (None: without; the last two are then 0)."""
    torch.manual_seed(0)
    model = load_model("simkit:cnn1d", seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    in_steps = in_close = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        monitor = None if every is None else simkit.Monitor(
            model, probe, every=every, n=len(probe), run_dir=Path(tmp) / "m", report=report, trackers=None)
        generator = torch.Generator().manual_seed(0)
        wall, cpu = time.perf_counter(), time.process_time()
        for step in range(1, steps + 1):
            batch = torch.randint(0, len(x), (128,), generator=generator)
            model.train()
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if monitor is not None:
                started = time.perf_counter()
                monitor.step(step)
                in_steps += time.perf_counter() - started
        if monitor is not None:
            started = time.perf_counter()
            monitor.close()
            in_close = time.perf_counter() - started
        return time.perf_counter() - wall, time.process_time() - cpu, in_steps, in_close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--report", action=argparse.BooleanOptionalAction, default=True,
                        help="write the HTML report at close (the Monitor's default)")
    args = parser.parse_args()
    data = load_data("mnist1d")
    x, y, probe = data.inputs[:-512], data.labels[:-512], data.inputs[-512:]
    train(20, 10, x, y, probe, args.report)  # warm-up (imports, allocator)
    ratios_wall, ratios_cpu, steady, closing = [], [], [], []
    for _ in range(args.repeats):
        bare = train(args.steps, None, x, y, probe, args.report)
        watched = train(args.steps, args.every, x, y, probe, args.report)
        ratios_wall.append(watched[0] / bare[0])
        ratios_cpu.append(watched[1] / bare[1])
        steady.append(watched[2] / bare[0])
        closing.append(watched[3] / bare[0])
        print(f"bare {bare[0]:.2f} s wall / {bare[1]:.2f} s CPU; monitored {watched[0]:.2f} / {watched[1]:.2f} "
              f"(in monitor.step {watched[2]:.2f} s, in close {watched[3]:.2f} s)")
    print(f"monitor every {args.every} steps, 512-sample probe, {args.steps} steps, report={args.report}: median "
          f"ratio {statistics.median(ratios_wall):.3f} wall, {statistics.median(ratios_cpu):.3f} CPU (target ≤ 1.05); "
          f"the measurements alone {1 + statistics.median(steady):.3f}, close() alone "
          f"{statistics.median(closing):.3f} of the bare run; torch threads {torch.get_num_threads()}, "
          f"load {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
