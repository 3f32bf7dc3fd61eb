"""Mutual k-NN, Jaccard k-NN and D-MNN (forward + backward) at large n: wall time, CPU time, peak memory.

    .venv/bin/python benchmarks/bench_knn.py                  # n = 50,000 × 512, both backends, 2 threads
    .venv/bin/python benchmarks/bench_knn.py --n 5000 --threads 1 --no-results   # a quick check

Issue #17's targets: each task ≤ 60 s wall on 2 cores with peak < 2 GB above the data, at n = 50,000,
d = 512, k = 10, called as the library's default call (``mutual_knn(x, y)``: preprocessing in float64;
``dmnn_loss(target, guide)`` on float32 activations). The data are float32 activations (a random ``x`` and
``y = 0.7·x + noise``, related but not equal). Tasks: ``mutual_knn`` and ``jaccard_knn`` with the torch
backend (the default) and, when faiss-cpu is installed, the faiss backend (``--backends``), and ``dmnn``.

Each measurement runs in its own subprocess so that its peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``; tracemalloc does not see torch's allocations) is its
own. "extra peak" is that peak minus the resident size just after the random data was created, i.e.
what the computation itself needed on top of torch and the inputs; for comparison the table shows the
size of one n × n float32 matrix, which the code never allocates. CPU seconds are reported beside wall
seconds because a shared machine stretches the wall time; the load average is printed with them.
Appends the lines, dated, to ``benchmarks/results/bench_knn.txt`` (unless ``--no-results``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

WALL_TARGET_S = 60.0
PEAK_TARGET_MIB = 2048.0


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def worker(args: argparse.Namespace) -> dict:
    import torch

    from simkit.metrics.knn import jaccard_knn, mutual_knn
    from simkit.metrics.losses import dmnn_loss

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.dim, generator=g)
    y = 0.7 * x + torch.randn(args.n, args.dim, generator=g)  # related, not equal
    base = rss_mib()
    task, _, backend = args.worker.partition(":")
    out = {"task": args.worker, "n": args.n, "dim": args.dim, "k": args.k, "threads": args.threads,
           "data_mib": 2 * x.numel() * x.element_size() / 2**20}
    start, cpu0 = time.perf_counter(), cpu_s()
    if task in ("mutual_knn", "jaccard_knn"):
        fn = mutual_knn if task == "mutual_knn" else jaccard_knn
        out["value"] = fn(x, y, k=args.k, backend=backend or None)
    else:
        target = y.requires_grad_()
        loss = dmnn_loss(target, x, k=args.k, tau=args.tau)
        out["forward_s"] = time.perf_counter() - start
        loss.backward()
        out["backward_s"] = time.perf_counter() - start - out["forward_s"]
        out["value"] = float(loss.detach())
        out["grad_norm"] = float(target.grad.norm())
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = cpu_s() - cpu0
    out["extra_peak_mib"] = rss_mib() - base
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--tau", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tasks", default="mutual_knn,jaccard_knn,dmnn")
    ap.add_argument("--backends", default="torch,faiss", help="k-NN backends to time (faiss skipped if missing)")
    ap.add_argument("--no-results", action="store_true", help="do not append to benchmarks/results/bench_knn.txt")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    from simkit.metrics.knn_search import faiss_available

    backends = [b for b in args.backends.split(",") if b != "faiss" or faiss_available()]
    jobs = []
    for task in args.tasks.split(","):
        jobs += [f"{task}:{b}" for b in backends] if task != "dmnn" else ["dmnn"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    rows = []
    for job in jobs:  # one at a time: each gets the cores
        cmd = [sys.executable, __file__, "--worker", job] + [
            a for opt in ("n", "dim", "k", "tau", "threads") for a in (f"--{opt}", str(getattr(args, opt)))]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode:
            raise SystemExit(f"worker {job} failed with exit code {done.returncode}:\n{done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    nn_mib = args.n * args.n * 4 / 2**20
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  n={args.n} dim={args.dim} k={args.k} "
             f"threads={args.threads}  load average {os.getloadavg()[0]:.1f}; inputs {rows[0]['data_mib']:.0f} MiB; "
             f"one n×n float32 matrix would be {nn_mib:.0f} MiB; targets <= {WALL_TARGET_S:.0f} s wall, "
             f"peak < {PEAK_TARGET_MIB:.0f} MiB"]
    for r in rows:
        extra = f" (forward {r['forward_s']:.1f} s, backward {r['backward_s']:.1f} s)" if "forward_s" in r else ""
        ok = r["seconds"] <= WALL_TARGET_S and r["extra_peak_mib"] < PEAK_TARGET_MIB
        lines.append(f"{r['task']:>18}: {r['seconds']:8.1f} s wall, {r['cpu_seconds']:8.1f} s CPU{extra}, "
                     f"extra peak {r['extra_peak_mib']:7.0f} MiB, value {r['value']:.6f}  "
                     f"{'within' if ok else 'MISSES'} the targets")
    values = {r["task"].split(":")[0]: set() for r in rows}
    for r in rows:
        values[r["task"].split(":")[0]].add(r["value"])
    same = all(len(v) == 1 for v in values.values())
    lines.append(f"backends agree on every score: {same}")
    print("\n".join(lines))
    if not args.no_results:
        path = Path(__file__).with_name("results") / "bench_knn.txt"
        path.parent.mkdir(exist_ok=True)
        with path.open("a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
