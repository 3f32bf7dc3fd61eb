"""How the cost grows with n (issue #41's scaling table): time and peak memory against the forwards.

Whole processes (``os.wait4``: CPU seconds, wall seconds, peak RSS), ResNet-18 vs ResNet-34 on synthetic
3×32×32 inputs, stem + every block + head (10 layers of ResNet-18, 18 of ResNet-34), batch 64, 2 threads:

  bare      the two models' forward passes over the n inputs (the floor);
  default   ``simkit compare`` with its defaults (linear + unbiased CKA, minibatch);
  exact     ``simkit compare --mode exact --reduce mean`` (linear + unbiased CKA);
  stored    each stored measure (``--metric rsa``, ``procrustes``, ``mutual_knn``; ``--mode exact --reduce
            mean``, no null) up to the n where its n × n state no longer fits the memory budget (the
            refusal is recorded, not an error);
  tokens    minibatch linear + unbiased CKA over token-level samples given as arrays (``compare_arrays``
            with ``samples="tokens"``: sequences of 64 tokens × 384 features, 6 layers a side) at 10⁵ and
            10⁶ tokens, in one process: minibatch (batches of 2 sequences, default null) and exact (no null).

For each row the slope k of time ∝ n^k between consecutive n (log-log) and over the whole range (a least
squares line, ``scipy.stats.linregress``) is printed. Run by hand on an idle machine:

    python benchmarks/bench_growth.py [--ns 1024,4096,16384,65536] [--stored-ns 1024,2048,4096,8192]
                                      [--tokens 100000,1000000] [--results benchmarks/results/bench_growth.txt]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_compare", HERE / "bench_compare.py")
bench_compare = importlib.util.module_from_spec(_spec)
sys.modules["bench_compare"] = bench_compare  # its dataclass looks its module up
_spec.loader.exec_module(bench_compare)  # type: ignore[union-attr]
Usage, run, cpu_name = bench_compare.Usage, bench_compare.run, bench_compare.cpu_name

LAYERS = "conv1,layer*.?,fc"
LAYERS_TOKENS = 3  # a side; 10^6 tokens x 384 features x 3 layers x 2 sides = 9.2 GB of float32 arrays
THREADS = "2"
BARE = textwrap.dedent("""
    import torch, torchvision
    torch.set_num_threads({threads})
    a = torchvision.models.resnet18(weights=None).eval()
    b = torchvision.models.resnet34(weights=None).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(0, {n}, 64):
            x = torch.randn(min(64, {n} - i), 3, 32, 32, generator=g)
            a(x); b(x)
""")


def compare_cmd(simkit: str, n: int, out: Path, extra: list[str]) -> list[str]:
    return [simkit, "compare", "torchvision:resnet18", "torchvision:resnet34", "--data", "synthetic:3x32x32",
            "--n", str(n), "--batch-size", "64", "--layers-a", LAYERS, "--layers-b", LAYERS, "--no-report",
            "--out", str(out), *extra]


def slopes(ns: list[int], seconds: list[float]) -> str:
    """Each step's slope k (time ∝ n^k) and the least-squares slope over the whole range."""
    from scipy.stats import linregress

    steps = [math.log(seconds[i + 1] / seconds[i]) / math.log(ns[i + 1] / ns[i]) for i in range(len(ns) - 1)]
    whole = linregress([math.log(n) for n in ns], [math.log(s) for s in seconds]).slope if len(ns) > 1 else float("nan")
    return f"slopes {', '.join(f'{k:.2f}' for k in steps)}; over the range {whole:.2f}"


def growth_rows(args: argparse.Namespace, simkit: str, work: Path, env: dict[str, str], say) -> None:
    """bare, default and exact at each n; ratios to the bare forwards."""
    rows: dict[str, list[Usage]] = {"bare": [], "default": [], "exact": []}
    for n in args.ns:
        rows["bare"].append(run([sys.executable, "-c", BARE.format(n=n, threads=THREADS)], env))
        rows["default"].append(run(compare_cmd(simkit, n, work / f"d{n}", []), env))
        rows["exact"].append(run(compare_cmd(simkit, n, work / f"e{n}", ["--mode", "exact", "--reduce", "mean"]), env))
        bare = rows["bare"][-1]
        for name in ("bare", "default", "exact"):
            u = rows[name][-1]
            say(f"n={n:>6}  {name:<8} {u.line()}  x forwards cpu {u.cpu / bare.cpu:.3f} wall {u.wall / bare.wall:.3f}")
    for name, usages in rows.items():
        say(f"{name:<8} CPU s {', '.join(f'{u.cpu:.1f}' for u in usages)}: {slopes(args.ns, [u.cpu for u in usages])}; "
            f"peak RSS {', '.join(f'{u.rss / 2**20:.2f}' for u in usages)} GB")


def stored_rows(args: argparse.Namespace, simkit: str, work: Path, env: dict[str, str], say) -> None:
    """Each stored measure at growing n until the memory budget refuses it."""
    for metric in args.stored:
        done_ns, seconds = [], []
        for n in args.stored_ns:
            cmd = compare_cmd(simkit, n, work / f"{metric}{n}", ["--mode", "exact", "--reduce", "mean",
                                                                  "--metric", metric, "--null", "0"])
            try:
                u = run(cmd, env)
            except subprocess.CalledProcessError as exc:
                last = (exc.stderr or "").strip().splitlines()[-1:] or ["?"]
                say(f"n={n:>6}  {metric:<12} refused or failed: {last[0][:200]}")
                break
            done_ns.append(n)
            seconds.append(u.cpu)
            say(f"n={n:>6}  {metric:<12} {u.line()}")
        if len(done_ns) > 1:
            say(f"{metric:<12} {slopes(done_ns, seconds)}")


def token_rows(args: argparse.Namespace, say) -> None:
    """Linear + unbiased CKA over token samples given as arrays, in this process: minibatch (batches of 2
    sequences = 128 tokens, the default chance level by whole-sequence permutations) and exact (no null)."""
    import torch

    import simkit

    torch.set_num_threads(int(THREADS))
    times: dict[str, list[float]] = {"minibatch": [], "exact": []}
    for tokens in args.tokens:
        sequences = tokens // 64
        g = torch.Generator().manual_seed(0)
        base = torch.randn(sequences, 64, 384, generator=g)
        acts_a = {f"a{i}": base + 0.5 * torch.randn(base.shape, generator=g) for i in range(LAYERS_TOKENS)}
        acts_b = {f"b{i}": base @ torch.randn(384, 384, generator=g) / 20 for i in range(LAYERS_TOKENS)}
        del base
        arrays_gb = sum(x.numel() * 4 for x in (*acts_a.values(), *acts_b.values())) / 2**30
        for mode, extra in (("minibatch", {"batch_size": 2}), ("exact", {"null": 0})):
            started = time.perf_counter()
            simkit.compare_arrays(acts_a, acts_b, samples="tokens", mode=mode, progress=False, **extra)
            times[mode].append(time.perf_counter() - started)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            say(f"tokens={sequences * 64:>8} ({sequences} sequences x 64, {LAYERS_TOKENS} x {LAYERS_TOKENS} layers "
                f"of 384) {mode:<9} CKA {times[mode][-1]:7.1f} s wall  {sequences * 64 / times[mode][-1]:,.0f} tokens/s  "
                f"peak RSS so far {peak:.2f} GB (the arrays themselves: {arrays_gb:.2f} GB)")
        del acts_a, acts_b
    for mode, seconds in times.items():
        if len(seconds) > 1:
            say(f"tokens {mode:<9} {slopes([t // 64 * 64 for t in args.tokens], seconds)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    parser.add_argument("--ns", type=ints, default=[1024, 4096, 16384, 65536])
    parser.add_argument("--stored", type=lambda t: t.split(","), default=["rsa", "procrustes", "mutual_knn"])
    parser.add_argument("--stored-ns", type=ints, default=[1024, 2048, 4096, 8192])
    parser.add_argument("--tokens", type=ints, default=[100_000, 1_000_000])
    parser.add_argument("--skip", type=lambda t: t.split(","), default=[], help="growth,stored,tokens")
    parser.add_argument("--results", type=Path, default=HERE / "results" / "bench_growth.txt")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS)
    simkit = str(Path(sys.executable).with_name("simkit"))
    work = Path(tempfile.mkdtemp(prefix="bench-growth-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  commit {commit}  threads={THREADS}  "
             f"load average {os.getloadavg()[0]:.1f}  CPU {cpu_name()}"]
    print(lines[0], flush=True)

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if "growth" not in args.skip:
        growth_rows(args, simkit, work, env, say)
    if "stored" not in args.skip:
        stored_rows(args, simkit, work, env, say)
    if "tokens" not in args.skip:
        token_rows(args, say)
    say(f"   load average {os.getloadavg()[0]:.1f} at the end")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
