"""Mutual k-NN and D-MNN (forward + backward) at large n: wall time and peak memory.

    .venv/bin/python benchmarks/bench_knn.py                  # n = 50,000 × 512, float32
    .venv/bin/python benchmarks/bench_knn.py --n 5000 --threads 1

Each measurement runs in its own subprocess so that its peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``; tracemalloc does not see torch's allocations) is its
own. "extra peak" is that peak minus the resident size just after the random data was created, i.e.
what the computation itself needed on top of torch and the inputs; for comparison the table shows the
size of one n × n float32 matrix, which the chunked code never allocates. CPU seconds are reported
beside wall seconds because a shared machine stretches the wall time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def worker(args: argparse.Namespace) -> dict:
    import torch

    from simkit.metrics.knn import mutual_knn
    from simkit.metrics.losses import dmnn_loss

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.dim, generator=g, dtype=dtype)
    y = 0.7 * x + torch.randn(args.n, args.dim, generator=g, dtype=dtype)  # related, not equal
    base = rss_mib()
    out = {"task": args.worker, "n": args.n, "dim": args.dim, "k": args.k, "dtype": args.dtype,
           "threads": args.threads, "data_mib": 2 * x.numel() * x.element_size() / 2**20}
    start, cpu0 = time.perf_counter(), cpu_s()
    if args.worker == "mutual_knn":
        out["value"] = mutual_knn(x, y, k=args.k, chunk=args.chunk, dtype=dtype)
    else:
        target = y.requires_grad_()
        loss = dmnn_loss(target, x, k=args.k, tau=args.tau, chunk=args.chunk or None)
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
    ap.add_argument("--chunk", type=int, default=None, help="rows per block (default: automatic)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--tasks", default="mutual_knn,dmnn")
    ap.add_argument("--parallel", action="store_true", help="run the tasks at the same time (own processes)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    procs = []
    for task in args.tasks.split(","):
        cmd = [sys.executable, __file__, "--worker", task] + [
            a for opt in ("n", "dim", "k", "tau", "threads", "dtype") for a in (f"--{opt}", str(getattr(args, opt)))
        ]
        if args.chunk:
            cmd += ["--chunk", str(args.chunk)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        if not args.parallel:
            procs[-1].wait()
    rows = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"worker failed with exit code {proc.returncode}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    nn_mib = args.n * args.n * 4 / 2**20
    print(f"n={args.n} dim={args.dim} k={args.k} {args.dtype} threads={args.threads}; "
          f"inputs {rows[0]['data_mib']:.0f} MiB; one n×n float32 matrix would be {nn_mib:.0f} MiB")
    for r in rows:
        extra = f" (forward {r['forward_s']:.1f} s, backward {r['backward_s']:.1f} s)" if "forward_s" in r else ""
        print(f"{r['task']:>10}: {r['seconds']:8.1f} s wall, {r['cpu_seconds']:8.1f} s CPU{extra}, extra peak memory {r['extra_peak_mib']:8.0f} MiB, "
              f"value {r['value']:.4f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
