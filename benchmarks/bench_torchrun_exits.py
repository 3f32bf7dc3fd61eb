"""How often does a two-rank torchrun run of simkit end with a non-zero exit (issue #25)?

The symptom this counts: torchrun reports ``exitcode: -6`` ("terminate called without an active
exception") from gloo's teardown *after* every rank finished and rank 0 wrote its result. Design:
- Arms: ``compare`` (two small MLPs on mnist1d, minibatch mode, 200 samples, a null of 3: broadcasts,
  all-reduces and an all-gather), ``train`` (``simkit linearize`` on digits: the training loop's
  gradient all-reduce every step) and ``fit`` (the bare ``simkit.training.fit`` script of
  tests/training/test_training.py, which joins the group without the CLI). Each arm runs ``--runs`` times,
  interleaved, with OMP_NUM_THREADS=1.
- Score: the number of runs whose torchrun exit status is not 0, and among them those whose stderr
  shows the teardown abort. The stderr of every failing run is kept under ``--keep`` for reading.

    python benchmarks/bench_torchrun_exits.py --runs 30
    python benchmarks/bench_torchrun_exits.py --runs 5 --arms compare,train   # what the slow test runs
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ABORT = "terminate called without an active exception"

FIT_SCRIPT = """
import json, sys
import torch
from torch import nn
from simkit import distributed
from simkit.training import fit, TrainConfig
distributed.init_if_launched("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)).double()
g = torch.Generator().manual_seed(1)
x = torch.randn(37, 5, generator=g, dtype=torch.float64)
y = x[:, :1].sin()
h = fit(model, lambda b: ((model(b[0]) - b[1]) ** 2).mean(), (x, y),
        TrainConfig(steps=8, batch_size=10, lr=0.05, optimizer="adam", progress=False), run_dir=sys.argv[1])
if distributed.is_main_process():
    open(sys.argv[1] + "/out.json", "w").write(json.dumps({"losses": h.losses}))
"""


def arm_command(arm: str, out: Path, script: Path, simkit: str) -> list[str]:
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2"]
    if arm == "compare":
        return [*torchrun, "--no-python", simkit, "compare",
                "simkit:mlp:in_features=40,hidden=16,depth=3", "simkit:mlp:in_features=40,hidden=12,depth=2",
                "--data", "mnist1d", "--layers-a", "blocks", "--layers-b", "blocks", "--batch-size", "32",
                "--mode", "minibatch", "--num-samples", "200", "--null", "3", "--no-report", "--out", str(out)]
    if arm == "train":
        return [*torchrun, "--no-python", simkit, "linearize",
                "simkit:cnn2d:channels=4,layers=2,batchnorm=false", "--data", "digits", "--num-samples", "300",
                "--train", "1", "--epochs", "1", "--omega", "1e-2", "--granularity", "channel",
                "--batch-size", "64", "--no-cka", "--no-report", "--out", str(out)]
    if arm == "fit":
        out.mkdir(parents=True, exist_ok=True)
        return [*torchrun, str(script), str(out)]
    raise SystemExit(f"unknown arm {arm!r}; choose from compare, train, fit")


def run_arms(arms: list[str], runs: int, keep: Path | None = None, timeout: float = 600,
             simkit: str | None = None) -> dict[str, dict]:
    """Run every arm ``runs`` times (interleaved); per arm: runs, failures, aborts, seconds, the exit codes.
    ``simkit``: the executable to launch (default: the ``simkit`` next to this Python)."""
    stats = {arm: {"runs": 0, "failures": 0, "aborts": 0, "seconds": 0.0, "codes": []} for arm in arms}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="simkit-exits-") as tmp:
        script = Path(tmp) / "fit.py"
        script.write_text(FIT_SCRIPT)
        for i in range(runs):
            for arm in arms:
                out = Path(tmp) / f"{arm}-{i}"
                start = time.perf_counter()
                done = subprocess.run(arm_command(arm, out, script, simkit or str(BIN / "simkit")), env=env, capture_output=True, text=True,
                                      timeout=timeout)
                s = stats[arm]
                s["runs"] += 1
                s["seconds"] += time.perf_counter() - start
                s["codes"].append(done.returncode)
                if done.returncode != 0:
                    s["failures"] += 1
                    s["aborts"] += ABORT in done.stderr
                    if keep is not None:
                        keep.mkdir(parents=True, exist_ok=True)
                        (keep / f"{arm}-{i}.stderr").write_text(done.stderr)
                shutil.rmtree(out, ignore_errors=True)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per arm")
    parser.add_argument("--arms", default="compare,train", help="comma list of compare, train, fit")
    parser.add_argument("--simkit", default=None, help="the simkit executable (default: next to this Python)")
    parser.add_argument("--keep", type=Path, default=None, help="folder for the stderr of failing runs")
    args = parser.parse_args()
    if shutil.which("torchrun", path=str(BIN)) is None:
        raise SystemExit("torchrun is not installed next to this Python")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    stats = run_arms(arms, args.runs, args.keep, simkit=args.simkit)
    total = sum(s["failures"] for s in stats.values())
    for arm, s in stats.items():
        print(f"{arm:8s} runs {s['runs']:3d}  non-zero exits {s['failures']:3d}  teardown aborts {s['aborts']:3d}  "
              f"mean {s['seconds'] / max(s['runs'], 1):.1f} s/run  codes {sorted(set(s['codes']))}")
    print(f"total: {sum(s['runs'] for s in stats.values())} runs, {total} non-zero exits")
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
