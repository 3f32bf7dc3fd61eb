"""simkit compare on a CUDA GPU against the models' bare forward passes there, and the speed-up over the CPU.

Issue #2's setting by default: ResNet-18 vs ResNet-34 (random weights), stem + every block + head
flattened, synthetic 3x64x64 images, n = 1024, batch 64. Measured in this one process, each figure the
best of ``--repeats`` passes after a warm-up pass (CUDA kernels, cuBLAS handles and allocator pools are
set up by the warm-up; ``torch.cuda.synchronize()`` brackets every timed pass):

  bare     the two models' forward passes over the data, batches moved to the GPU as compare moves them;
  default  ``simkit.compare(..., device="cuda")``: linear + unbiased CKA, minibatch mode (the CLI default);
  exact    the same in exact mode with ``reduce="mean"`` (n = ``--exact-n``, 512 by default);
  cpu      the default compare on the CPU (``--cpu-threads`` threads, 2 by default) for the speed-up.

Prints one line per figure, the ratios and the speed-up, and appends them, dated, to
``benchmarks/results/bench_gpu.txt``. Without CUDA (CI, this project's CPU machines) it says so and
exits 0 having measured nothing; ``--device cpu`` runs the same code on the CPU (a check of the script,
not a GPU figure: nothing is written to the results file then).

Usage: python benchmarks/bench_gpu.py [--n 1024] [--exact-n 512] [--repeats 3] [--skip-cpu]
       python benchmarks/bench_gpu.py --device cpu --n 64 --exact-n 64 --repeats 1 --skip-cpu   # check
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

LAYERS = "conv1,bn1,relu,maxpool,layer*.?,avgpool,fc"
RESULTS = Path(__file__).parent / "results" / "bench_gpu.txt"


def no_gpu_reason() -> str | None:
    """Why no CUDA device can be used (None when one can)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - simkit needs torch
        return "torch is not installed"
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return ("torch.cuda.is_available() is False (this torch build has no CUDA support)" if built is None
                else f"torch.cuda.is_available() is False (torch built for CUDA {built}, but no usable GPU "
                     "or driver here)")
    return None


def best_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """Best wall seconds of ``repeats`` calls of ``fn`` after one warm-up call, synchronised by ``sync``."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def measure(device: str, n: int, exact_n: int, repeats: int, cpu_threads: int, skip_cpu: bool,
            model_a: str, model_b: str, data_spec: str, layers: str, batch_size: int) -> list[str]:
    """Every figure of the module docstring on ``device``; returns the printed lines."""
    import torch

    import simkit
    from simkit.data import load_data
    from simkit.models import load_model

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    models = [load_model(model_a, seed=0).to(dev), load_model(model_b, seed=1).to(dev)]
    inputs = load_data(data_spec, n=max(n, exact_n), seed=0).inputs
    assert isinstance(inputs, torch.Tensor)
    lines = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    def bare(count: int) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                for start in range(0, count, batch_size):
                    batch = inputs[start:start + batch_size].to(dev, non_blocking=True)
                    for model in models:
                        model(batch)
        return run

    def compare(count: int, mode: str, reduce: str, on: torch.device) -> Callable[[], object]:
        def run() -> object:
            return simkit.compare(models[0], models[1], inputs[:count], layers_a=layers, layers_b=layers,
                                  mode=mode, reduce=reduce, batch_size=batch_size, device=on, progress=False)
        return run

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (script check, not a GPU figure)"
    say(f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  {name}  {model_a} vs {model_b}  n={n} "
        f"exact n={exact_n} batch {batch_size} repeats={repeats}  load average {os.getloadavg()[0]:.1f}")
    t_bare = best_seconds(bare(n), repeats, sync)
    t_default = best_seconds(compare(n, "minibatch", "auto", dev), repeats, sync)
    say(f"  bare forwards            {t_bare:8.3f} s")
    say(f"  compare (default)        {t_default:8.3f} s   {t_default / t_bare:.3f} x the bare forwards")
    t_bare_exact = best_seconds(bare(exact_n), repeats, sync) if exact_n != n else t_bare
    t_exact = best_seconds(compare(exact_n, "exact", "mean", dev), repeats, sync)
    say(f"  bare forwards n={exact_n:<6d}  {t_bare_exact:8.3f} s")
    say(f"  compare exact, mean      {t_exact:8.3f} s   {t_exact / t_bare_exact:.3f} x the bare forwards")
    if not skip_cpu:
        threads = torch.get_num_threads()
        torch.set_num_threads(cpu_threads)
        try:
            for model in models:
                model.to("cpu")
            t_cpu = best_seconds(compare(n, "minibatch", "auto", torch.device("cpu")), 1, lambda: None)
        finally:
            torch.set_num_threads(threads)
            for model in models:
                model.to(dev)
        say(f"  compare (default) on the CPU, {cpu_threads} threads {t_cpu:8.3f} s   speed-up {t_cpu / t_default:.1f} x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a check of the script only)")
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--exact-n", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--skip-cpu", action="store_true", help="skip the CPU compare (the speed-up)")
    parser.add_argument("--model-a", default="torchvision:resnet18")
    parser.add_argument("--model-b", default="torchvision:resnet34")
    parser.add_argument("--data", default="synthetic:3x64x64")
    parser.add_argument("--layers", default=LAYERS)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.device != "cpu":
        reason = no_gpu_reason()
        if reason is not None:
            print(f"bench_gpu: no GPU here: {reason}; nothing measured. Run it on a machine with CUDA "
                  "(or pass --device cpu to check the script).")
            return 0
    lines = measure(args.device, args.n, args.exact_n, args.repeats, args.cpu_threads, args.skip_cpu,
                    args.model_a, args.model_b, args.data, args.layers, args.batch_size)
    if args.device != "cpu":
        args.results.parent.mkdir(parents=True, exist_ok=True)
        with args.results.open("a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
