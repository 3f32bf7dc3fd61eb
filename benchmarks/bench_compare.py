"""Speed and memory of `simkit compare` against its physical floor, the models' own forward passes.

Measured as whole processes, each pinned to the same thread count:
  bare      a plain script that builds ResNet-18 and ResNet-34 and runs their forward passes over the data;
  simkit    `simkit compare ... --no-report` (linear + unbiased CKA, minibatch mode), stem + every block + head;
  torch-cka the torch-cka package on the same work, when installed (`pip install torch-cka`);
  report    `simkit report DIR` on the run directory;
  memory    peak RSS of an exact-mode compare with --reduce mean at n = 8192 against n = 1024;
  exact     (--exact) `simkit compare --mode exact --reduce mean` at n = --exact-n (512) against the bare
            forwards of the same n, alternating (issue #17's target: <= 1.15x);
  ci        (--ci) the default compare with `--ci 0.95` against without, alternating (target <= 1.03x);
  p-values  (--p-values) the default compare with `--p-values` against without, alternating (issue #36's
            target: <= 1.3x);
  breakdown (--breakdown) where the time goes (with --exact, exact mode's too): the bare forward
            passes, the same with simkit's capture hooks, and the minibatch accumulator, split into its per-batch Grams
            (simkit.metrics.gram.batch_grams) and the rest; then a whole `simkit compare` run in this
            process with each part timed (model building, data, forwards + hooks, Grams, the rest of the
            accumulation, compute, result writing, everything else), each part's share of the run and of
            the bare forwards, and the start-up of a process (imports) against the bare script's; the
            floor is the bare forwards plus the Grams.

Usage: python benchmarks/bench_compare.py [--repeats 2] [--skip-speed] [--skip-memory] [--skip-torch-cka]
                                         [--exact] [--ci] [--p-values] [--breakdown] [--n 1024]
                                         [--results benchmarks/results/bench_compare.txt]

Every child is measured by ``os.wait4``: CPU seconds (user + sys of the child, the primary figure on a
shared, loaded machine, where wall time mostly measures the other tenants), wall seconds and peak RSS.
bare and simkit alternate within each repeat and the best of each is kept; each repeat's paired ratio and
their median follow (steadier where the bare forwards alone vary by 10 %). simkit's own modules are
byte-compiled first (:func:`compile_checkout`), as an installation leaves them. Prints one line per
measurement and the ratios, and appends them, dated, to the results file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

LAYERS = "conv1,bn1,relu,maxpool,layer*.?,avgpool,fc"
THREADS = "2"

BARE = textwrap.dedent("""
    import torch, torchvision
    torch.set_num_threads({threads})
    a = torchvision.models.resnet18(weights=None).eval()
    b = torchvision.models.resnet34(weights=None).eval()
    x = torch.randn({n}, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for i in range(0, {n}, 64):
            a(x[i:i + 64]); b(x[i:i + 64])
""")

TORCH_CKA = textwrap.dedent("""
    import torch, torchvision
    from torch_cka import CKA
    torch.set_num_threads({threads})
    a = torchvision.models.resnet18(weights=None).eval()
    b = torchvision.models.resnet34(weights=None).eval()
    x = torch.randn({n}, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    names = lambda m: ["conv1", "bn1", "relu", "maxpool"] + [f"layer{{i}}.{{j}}" for i in range(1, 5)
        for j in range(len(getattr(m, f"layer{{i}}")))] + ["avgpool", "fc"]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros({n})), batch_size=64)
    cka = CKA(a, b, model1_layers=names(a), model2_layers=names(b), device="cpu")
    cka.compare(loader)
""")


def compile_checkout() -> None:
    """Byte-compile simkit and its CLI, as an installation (or a first run) leaves them: an editable checkout
    in an environment with ``PYTHONDONTWRITEBYTECODE`` set (this machine's) would otherwise compile every
    simkit module from source in every timed process (0.35-0.45 s of CPU), which the bare script's
    pip-installed torch never pays."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for folder in ("simkit", "cli"):
        compileall.compile_dir(str(root / folder), quiet=1)


@dataclass
class Usage:
    """One child process: CPU seconds (user + sys), wall seconds, peak RSS in KiB."""

    cpu: float
    wall: float
    rss: int

    def line(self) -> str:
        return f"cpu {self.cpu:7.2f} s  wall {self.wall:7.2f} s  peak RSS {self.rss / 1024:7.1f} MiB"


def cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo; the platform's word elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def run(cmd: list[str], env: dict[str, str]) -> Usage:
    """Measure one child process (stderr kept for the error message)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if status != 0:
            err.seek(0)
            raise subprocess.CalledProcessError(status, cmd, stderr=err.read().decode(errors="replace")[-2000:])
    return Usage(usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss)


def best_of(runs: list[Usage]) -> Usage:
    """Best CPU and best wall (possibly of different repeats) and the largest RSS."""
    return Usage(min(r.cpu for r in runs), min(r.wall for r in runs), max(r.rss for r in runs))


def paired_ratios(bare_runs: list[Usage], ours_runs: list[Usage]) -> str:
    """Each repeat's CPU ratio (the two ran back to back) and their median: steadier than the best-of ratio
    where the bare forwards alone vary by 10 % between repeats."""
    ratios = [o.cpu / b.cpu for b, o in zip(bare_runs, ours_runs, strict=True)]
    return (f"  per repeat cpu {' '.join(f'{r:.3f}' for r in ratios)}  median {statistics.median(ratios):.3f}")


def models_and_batches(n: int) -> tuple[list, list]:
    """ResNet-18 and ResNet-34 (random init, eval) and ``n`` synthetic 3×64×64 inputs in batches of 64."""
    import torch
    import torchvision

    torch.set_num_threads(int(THREADS))
    models = [torchvision.models.resnet18(weights=None).eval(), torchvision.models.resnet34(weights=None).eval()]
    x = torch.randn(n, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return models, [x[i:i + 64] for i in range(0, n, 64)]


def bare_forwards(models: list, batches: list) -> None:
    """The floor: both models over every batch, nothing else."""
    import torch

    with torch.no_grad():
        for batch in batches:
            for model in models:
                model(batch)


def warm_seconds(fn, *args) -> tuple[float, object]:
    """Seconds of the second of two calls of ``fn(*args)`` (the first warms up), and its value."""
    fn(*args)
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def exact_breakdown(n: int) -> list[str]:
    """The exact section's `simkit compare` in this process, each part timed against the warm bare forwards."""
    t_bare, _ = warm_seconds(bare_forwards, *models_and_batches(n))
    return [f"in-process breakdown of exact mode, n={n}, batch 64: bare forwards {t_bare:.2f} s",
            *run_breakdown(n, t_bare, exact=True)]


def breakdown(n: int) -> list[str]:
    """Seconds of each part of a minibatch compare, in this process (second pass of each, warm)."""
    import torch

    from simkit.engine.sources import Tap
    from simkit.layers import resolve_layers
    from simkit.metrics import gram
    from simkit.metrics.settings import CompareSettings
    from simkit.metrics.streaming import make_accumulator

    models, batches = models_and_batches(n)
    grams = [0.0]
    original = gram.batch_grams

    def timed_grams(acts):
        start = time.perf_counter()
        out = original(acts)
        grams[0] += time.perf_counter() - start
        return out

    def hooked(accumulate: bool) -> float:
        acc, spent = None, 0.0
        for batch in batches:
            acts = [tap.step(batch) for tap in taps]
            start = time.perf_counter()
            if accumulate:
                if acc is None:
                    acc = make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"], mode="minibatch", null=0), [a.shape[1] for a in acts[0]], [b.shape[1] for b in acts[1]])
                acc.update(*acts)
            spent += time.perf_counter() - start
        return spent

    import simkit.metrics.streaming.minibatch as streaming  # the module whose batch_grams the accumulator calls

    t_bare, _ = warm_seconds(bare_forwards, models, batches)  # before any hook exists
    taps = [Tap(m, resolve_layers(m, LAYERS), label, reduce="auto", output_index=None, device=torch.device("cpu"))
            for m, label in zip(models, "ab", strict=True)]
    streaming.batch_grams = timed_grams
    try:
        t_hooks, _ = warm_seconds(hooked, False)
        grams[0] = 0.0
        hooked(True)
        grams[0] = 0.0
        start = time.perf_counter()
        t_acc = hooked(True)
        t_all = time.perf_counter() - start
    finally:
        streaming.batch_grams = original
        for tap in taps:
            tap.close()
    return [f"in-process breakdown, n={n}, batch 64 (seconds)",
            f"  bare forwards {t_bare:7.2f}   with capture hooks {t_hooks:7.2f} ({t_hooks / t_bare:.3f}x)",
            f"  compare pass  {t_all:7.2f} ({t_all / t_bare:.3f}x): accumulator {t_acc:.2f}, of which Grams "
            f"{grams[0]:.2f} ({grams[0] / t_bare:.1%} of the bare forwards)",
            f"  floor (bare forwards + Grams) {t_bare + grams[0]:.2f} s = {(t_bare + grams[0]) / t_bare:.3f}x "
            "the bare forwards", *run_breakdown(n, t_bare)]


class Timed:
    """Replace ``owner.name`` by a wrapper adding its wall seconds to ``self.seconds`` (undone by ``undo``)."""

    def __init__(self, owner: object, name: str):
        self.owner, self.name, self.seconds = owner, name, 0.0
        self.original = getattr(owner, name)
        original = self.original

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(owner, name, wrapper)

    def undo(self) -> None:
        setattr(self.owner, self.name, self.original)


def startup_seconds(env: dict[str, str], repeats: int = 3) -> tuple[float, float]:
    """Best wall seconds of a process that imports what `simkit compare` imports before its first model,
    and of one importing what the bare script imports (torch, torchvision)."""
    ours = run([sys.executable, "-c", "import simkit.cli.main, torch, torchvision"], env)
    theirs = run([sys.executable, "-c", "import torch, torchvision"], env)
    for _ in range(repeats - 1):
        ours = best_of([ours, run([sys.executable, "-c", "import simkit.cli.main, torch, torchvision"], env)])
        theirs = best_of([theirs, run([sys.executable, "-c", "import torch, torchvision"], env)])
    return ours.wall, theirs.wall


def run_breakdown(n: int, t_bare: float, exact: bool = False) -> list[str]:
    """One `simkit compare` (the speed section's command, or the exact section's with ``exact``) in this
    process, each part timed."""
    import simkit.engine.loading
    import simkit.report
    from simkit.cli.main import app
    from simkit.engine.sources import Tap
    from simkit.metrics.streaming import Accumulator
    from simkit.metrics.streaming import minibatch as streaming

    work = Path(tempfile.mkdtemp(prefix="bench-breakdown-"))
    parts = {"models": [Timed(simkit.engine.loading, "load_model")],   # the names load_pair calls
             "data": [Timed(simkit.engine.loading, "load_data")], "forwards + hooks": [Timed(Tap, "step")],
             "Grams": [Timed(streaming, "batch_grams")], "accumulate": [Timed(Accumulator, "update")],
             "compute": [Timed(Accumulator, "compute")], "writing": [Timed(simkit.report, "save_run")]}
    start = time.perf_counter()
    try:
        app(compare_args(n, work / "run", exact), standalone_mode=False)
    finally:
        total = time.perf_counter() - start
        for timers in parts.values():
            for t in timers:
                t.undo()
    seconds = {k: sum(t.seconds for t in v) for k, v in parts.items()}
    seconds["accumulate"] -= seconds["Grams"]  # the Grams run inside update
    seconds["other (CLI, checks, engine)"] = total - sum(seconds.values())
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS)
    ours, theirs = startup_seconds(env)
    lines = [f"whole `simkit compare{' --mode exact --reduce mean' if exact else ''}` (n={n}) in this process: "
             f"{total:.2f} s (after imports); parts, seconds, share of the run, share of the bare forwards:"]
    for name, sec in seconds.items():
        lines.append(f"  {name:<28} {sec:7.2f}  {sec / total:6.1%}  {sec / t_bare:6.1%}")
    lines.append(f"  process start-up: import simkit.cli.main + torch + torchvision {ours:.2f} s against the bare "
                 f"script's torch + torchvision {theirs:.2f} s: {ours - theirs:+.2f} s "
                 f"({(ours - theirs) / t_bare:+.1%} of the bare forwards)")
    beyond = seconds["accumulate"] + seconds["compute"] + seconds["writing"] + seconds["other (CLI, checks, engine)"] \
        + (seconds["forwards + hooks"] - t_bare) + (ours - theirs)
    target = "(the exact pass has no Grams: its floor is the bare forwards)" if exact else "(target <= 3 %)"
    lines.append(f"  beyond the floor (hooks, accumulation, compute, writing, CLI, start-up): {beyond:.2f} s = "
                 f"{beyond / t_bare:.1%} of the bare forwards {target}")
    return lines


def compare_args(n: int, out: Path, exact: bool = False) -> list[str]:
    """The speed section's `simkit compare` arguments (issue #2's setting); ``exact``: the exact section's
    (``--mode exact --reduce mean``)."""
    mode = ["--mode", "exact", "--reduce", "mean"] if exact else ["--mode", "minibatch"]
    return ["compare", "torchvision:resnet18", "torchvision:resnet34", "--data", "synthetic:3x64x64", "--n", str(n),
            "--batch-size", "64", "--layers-a", LAYERS, "--layers-b", LAYERS, "--metric", "linear_cka,unbiased_cka",
            *mode, "--no-report", "--out", str(out)]


def speed(args: argparse.Namespace, simkit: str, work: Path, env: dict[str, str], say) -> None:
    """The default compare against the bare forwards (alternating), torch-cka, and the report."""
    compare = [simkit, *compare_args(args.n, work / "run")]
    bare_cmd = [sys.executable, "-c", BARE.format(n=args.n, threads=THREADS)]
    bare_runs, ours_runs = [], []
    for _ in range(args.repeats):  # alternate, so both see the same mix of load
        bare_runs.append(run(bare_cmd, env))
        say(f"  bare    {bare_runs[-1].line()}")
        ours_runs.append(run(compare, env))
        say(f"  simkit  {ours_runs[-1].line()}")
    bare, ours = best_of(bare_runs), best_of(ours_runs)
    say(f"bare forwards   {bare.line()}")
    say(f"simkit compare  {ours.line()}")
    say(f"ratio simkit / bare: cpu {ours.cpu / bare.cpu:.3f}  wall {ours.wall / bare.wall:.3f}  (target <= 1.12)")
    say(paired_ratios(bare_runs, ours_runs))
    if not args.skip_torch_cka:
        try:
            theirs = run([sys.executable, "-c", TORCH_CKA.format(n=args.n, threads=THREADS)], env)
            say(f"torch-cka       {theirs.line()}")
            say(f"ratio torch-cka / bare: cpu {theirs.cpu / bare.cpu:.3f}  wall {theirs.wall / bare.wall:.3f}")
        except subprocess.CalledProcessError as exc:
            say(f"torch-cka       failed ({(exc.stderr or '').strip().splitlines()[-1:]}); pip install torch-cka")
    report = run([simkit, "report", str(work / "run")], env)
    say(f"simkit report   {report.line()}  (whole process)")


def memory(args: argparse.Namespace, simkit: str, work: Path, env: dict[str, str], say) -> None:
    """Peak RSS of exact mode with --reduce mean at n = 8192 against n = 1024."""
    peaks = {}
    for n in (1024, 8192):
        cmd = [simkit, "compare", "torchvision:resnet18", "torchvision:resnet34", "--data",
               "synthetic:3x64x64", "--n", str(n), "--layers-a", LAYERS, "--layers-b", LAYERS,
               "--mode", "exact", "--reduce", "mean", "--no-report", "--out", str(work / f"mem{n}")]
        peaks[n] = run(cmd, env)
        say(f"exact mean n={n:5d}  {peaks[n].line()}")
    say(f"memory ratio n=8192 / n=1024: {peaks[8192].rss / peaks[1024].rss:.3f}  (target <= 1.2)")


def exact(args: argparse.Namespace, simkit: str, work: Path, env: dict[str, str], say) -> None:
    """Exact mode --reduce mean against the bare forwards of the same n (alternating)."""
    exact_cmd = [simkit, *compare_args(args.exact_n, work / "exact", exact=True)]
    bare_cmd = [sys.executable, "-c", BARE.format(n=args.exact_n, threads=THREADS)]
    bare_runs, exact_runs = [], []
    for _ in range(args.repeats):
        bare_runs.append(run(bare_cmd, env))
        say(f"  bare n={args.exact_n}   {bare_runs[-1].line()}")
        exact_runs.append(run(exact_cmd, env))
        say(f"  exact mean {exact_runs[-1].line()}")
    bare, ours = best_of(bare_runs), best_of(exact_runs)
    say(f"ratio exact --reduce mean / bare (n={args.exact_n}): cpu {ours.cpu / bare.cpu:.3f}  "
        f"wall {ours.wall / bare.wall:.3f}  (target <= 1.15)")
    say(paired_ratios(bare_runs, exact_runs))


def option_cost(simkit: str, n: int, repeats: int, work: Path, env: dict[str, str], say,
                option: list[str], target: float) -> str:
    """The default compare with ``option`` (e.g. ``--ci 0.95``, ``--p-values``) against without, alternating."""
    plain = [simkit, *compare_args(n, work / "plain")]
    with_option = [simkit, *compare_args(n, work / "option"), *option]
    label = " ".join(option)
    plain_runs, option_runs = [], []
    for _ in range(repeats):
        plain_runs.append(run(plain, env))
        say(f"  compare        {plain_runs[-1].line()}")
        option_runs.append(run(with_option, env))
        say(f"  compare {label:<11} {option_runs[-1].line()}")
    a, b = best_of(plain_runs), best_of(option_runs)
    return (f"ratio {label} / without (minibatch, n={n}): cpu {b.cpu / a.cpu:.3f}  wall {b.wall / a.wall:.3f}  "
            f"(target <= {target})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-torch-cka", action="store_true")
    parser.add_argument("--breakdown", action="store_true", help="also time the parts in one process")
    parser.add_argument("--exact", action="store_true", help="also exact mode --reduce mean against the bare forwards")
    parser.add_argument("--exact-n", type=int, default=512)
    parser.add_argument("--ci", action="store_true", help="also the default compare with --ci 0.95 against without")
    parser.add_argument("--p-values", action="store_true",
                        help="also the default compare with --p-values (Holm) against without")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "bench_compare.txt")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS)
    simkit = str(Path(sys.executable).with_name("simkit"))
    compile_checkout()
    work = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  n={args.n} threads={THREADS} "
             f"repeats={args.repeats}  load average {os.getloadavg()[0]:.1f}  CPU {cpu_name()}"]

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if not args.skip_speed:
        speed(args, simkit, work, env, say)
    if not args.skip_memory:
        memory(args, simkit, work, env, say)
    if args.exact:
        exact(args, simkit, work, env, say)
    if args.ci:
        say(option_cost(simkit, args.n, args.repeats, work, env, say, ["--ci", "0.95"], 1.03))
    if args.p_values:
        say(option_cost(simkit, args.n, args.repeats, work, env, say, ["--p-values"], 1.3))
    if args.breakdown:
        for line in breakdown(args.n):
            say(line)
    if args.breakdown and args.exact:
        for line in exact_breakdown(args.exact_n):
            say(line)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
