"""Activations from files and arrays (issue #35): files larger than memory, and arrays against a model pair.

files   Two ``.npy`` files of ``--gb`` GB each (float32, ``--width`` features; B = A·W + noise, written in
        chunks, never held in memory), compared with ``simkit compare A.npy B.npy --mode exact --metric
        linear_cka,unbiased_cka --no-report`` as a child process; then both imported into simkit caches
        (``simkit capture --from``) and the caches compared the same way. Reports, per child (``os.wait4``):
        wall and CPU seconds, peak RSS, and rows per second. Target: peak RSS below 1.5 GB for the files'
        comparison, whose size is above half the machine's memory.
arrays  In one process, the same activations two ways: ``simkit.compare(model_a, model_b, data)`` (a
        ResNet-18 / ResNet-34 pair at 32×32, minibatch, default measures) against
        ``simkit.compare_arrays`` on the activations that pair's forwards produced (captured in memory
        once), and the bare forwards; alternating, best of ``--repeats``. Target: arrays ≤ model − forwards.

Usage: python benchmarks/bench_arrays.py [--gb 8] [--width 512] [--skip-files] [--skip-arrays]
                                         [--folder /tmp/simkit-bench-arrays] [--keep] [--reuse]
The files are written by a child process: a child's peak RSS as ``os.wait4`` reports it starts from its
parent's at the fork, so the measuring process itself stays small (an earlier version wrote them itself
and every child then reported the writer's 12.7 GB).
Prints one line per measurement and appends them, dated, to benchmarks/results/bench_arrays.txt. Run by
hand on an idle machine (load under 1) and name the CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_arrays.txt"
SIMKIT = [sys.executable, "-m", "simkit.cli.main"]


def log(lines: list[str], text: str) -> None:
    print(text, flush=True)
    lines.append(text)


def child(cmd: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS GB) of a child process that must succeed."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    out, err = proc.stdout.read(), proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out[-2000:]}\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 2**20


def write_pair(folder: Path, gb: float, width: int, seed: int = 0) -> int:
    """Write A.npy and B.npy of ``gb`` GB each in chunks; returns the rows."""
    rows = int(gb * 1e9 / (4 * width))
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(width, width)).astype(np.float32) / np.sqrt(width)
    a = np.lib.format.open_memmap(folder / "A.npy", mode="w+", dtype=np.float32, shape=(rows, width))
    b = np.lib.format.open_memmap(folder / "B.npy", mode="w+", dtype=np.float32, shape=(rows, width))
    chunk = 65536
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        x = rng.normal(size=(stop - start, width)).astype(np.float32)
        a[start:stop] = x
        b[start:stop] = x @ mix + 0.5 * rng.normal(size=x.shape).astype(np.float32)
        a.flush()
        b.flush()
    del a, b
    return rows


def drop_page_cache_hint(paths: list[Path]) -> None:
    """Ask the kernel to drop the files' cached pages, so each run reads them from disk alike."""
    for path in paths:
        for file in (path.rglob("*") if path.is_dir() else [path]):
            if file.is_file():
                fd = os.open(file, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)


def bench_files(args: argparse.Namespace, lines: list[str]) -> None:
    folder = Path(args.folder)
    started = time.perf_counter()
    if args.reuse and (folder / "A.npy").is_file() and (folder / "B.npy").is_file():
        rows = int(np.load(folder / "A.npy", mmap_mode="r").shape[0])
        for stale in ("run-files", "run-caches", "cache-A", "cache-B"):
            shutil.rmtree(folder / stale, ignore_errors=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        # written by a child process: a child's peak RSS (os.wait4) starts from its parent's at the fork, so
        # this process must never hold the files' pages itself
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_arrays; " \
               f"print(bench_arrays.write_pair(__import__('pathlib').Path({str(folder)!r}), {args.gb}, {args.width}))"
        rows = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    made = "reused" if args.reuse else f"written in {time.perf_counter() - started:.0f} s"
    log(lines, f"files: 2 x {args.gb:g} GB .npy ({rows} rows x {args.width} float32) {made}; machine memory {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.1f} GiB")
    common = ["--mode", "exact", "--metric", "linear_cka,unbiased_cka", "--no-report"]
    files = [folder / "A.npy", folder / "B.npy"]
    drop_page_cache_hint(files)
    wall_f, cpu, rss = child([*SIMKIT, "compare", *map(str, files), *common, "--out", str(folder / "run-files")])
    log(lines, f"compare A.npy B.npy (exact):   {wall_f:7.1f} s wall {cpu:7.1f} s CPU  peak RSS {rss:5.2f} GB  "
               f"{rows / wall_f:,.0f} rows/s  (target RSS < 1.5 GB)")
    for side in ("A", "B"):
        wall, cpu, rss = child([*SIMKIT, "capture", "--from", str(folder / f"{side}.npy"),
                                "--out", str(folder / f"cache-{side}")])
        log(lines, f"capture --from {side}.npy:        {wall:7.1f} s wall {cpu:7.1f} s CPU  peak RSS {rss:5.2f} GB")
    caches = [folder / "cache-A", folder / "cache-B"]
    drop_page_cache_hint(caches)
    wall_c, cpu_c, rss_c = child([*SIMKIT, "compare", *map(str, caches), *common, "--out", str(folder / "run-caches")])
    log(lines, f"compare cache-A cache-B:       {wall_c:7.1f} s wall {cpu_c:7.1f} s CPU  peak RSS {rss_c:5.2f} GB  "
               f"{rows / wall_c:,.0f} rows/s")
    log(lines, f"files / caches throughput: {(rows / wall_f) / (rows / wall_c):.3f}")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)


def bench_arrays(args: argparse.Namespace, lines: list[str]) -> None:
    import torch

    import simkit
    from simkit.data import load_data
    from simkit.forward import run_model
    from simkit.layers import record_layers
    from simkit.models import load_model

    torch.set_num_threads(2)
    data = load_data(args.data, n=args.n)
    models = [load_model(spec, seed=0) for spec in ("torchvision:resnet18", "torchvision:resnet34")]
    for m in models:
        m.eval()
    inputs = data.inputs

    def forwards() -> None:
        with torch.no_grad():
            for start in range(0, len(inputs), 64):
                for m in models:
                    run_model(m, inputs[start:start + 64])

    def captured() -> list[dict[str, torch.Tensor]]:
        out = []
        for m in models:
            with record_layers(m, "blocks", reduce="auto") as taps:
                parts: dict[str, list[torch.Tensor]] = {}
                for start in range(0, len(inputs), 64):
                    run_model(m, inputs[start:start + 64])
                    for name, value in taps.pop().items():
                        parts.setdefault(name, []).append(value.float())
            out.append({name: torch.cat(v) for name, v in parts.items()})
        return out

    acts_a, acts_b = captured()
    timings: dict[str, list[float]] = {"forwards": [], "model": [], "arrays": []}
    for _ in range(args.repeats):
        started = time.perf_counter()
        forwards()
        timings["forwards"].append(time.perf_counter() - started)
        started = time.perf_counter()
        simkit.compare(models[0], models[1], data, layers_a="blocks", layers_b="blocks", progress=False)
        timings["model"].append(time.perf_counter() - started)
        started = time.perf_counter()
        simkit.compare_arrays(acts_a, acts_b, progress=False)
        timings["arrays"].append(time.perf_counter() - started)
    best = {k: min(v) for k, v in timings.items()}
    log(lines, f"arrays: n={len(inputs)} {args.data}, resnet18 vs resnet34 blocks ({len(acts_a)} x {len(acts_b)} layers), "
               f"best of {args.repeats}: forwards {best['forwards']:.2f} s, model pair {best['model']:.2f} s, "
               f"arrays {best['arrays']:.2f} s; arrays / (model - forwards) = "
               f"{best['arrays'] / max(1e-9, best['model'] - best['forwards']):.3f} (target <= 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=8.0)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--folder", default="/tmp/simkit-bench-arrays")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--reuse", action="store_true", help="use A.npy and B.npy already in --folder")
    parser.add_argument("--skip-files", action="store_true")
    parser.add_argument("--skip-arrays", action="store_true")
    parser.add_argument("--data", default="synthetic:3x32x32")
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  commit {commit}  {platform.processor() or platform.machine()} "
             f"{os.cpu_count()} cores  load {load:.2f} at start"]
    print(lines[0])
    if not args.skip_files:
        bench_files(args, lines)
    if not args.skip_arrays:
        bench_arrays(args, lines)
    lines.append(f"   load {os.getloadavg()[0]:.2f} at the end")
    with open(args.results, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
