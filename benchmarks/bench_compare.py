"""Speed and memory of `simkit compare` against its physical floor, the models' own forward passes.

Measured as whole processes, each pinned to the same thread count:
  bare      a plain script that builds ResNet-18 and ResNet-34 and runs their forward passes over the data;
  simkit    `simkit compare ... --no-report` (linear + unbiased CKA, minibatch mode), stem + every block + head;
  torch-cka the torch-cka package on the same work, when installed (`pip install torch-cka`);
  report    `simkit report DIR` on the run directory;
  memory    peak RSS of an exact-mode compare with --reduce mean at n = 8192 against n = 1024.

Usage: python benchmarks/bench_compare.py [--repeats 2] [--skip-memory] [--skip-torch-cka]
Prints one line per measurement and the ratios; append the output to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
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


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        raise subprocess.CalledProcessError(status, cmd, stderr=proc.stderr.read())
    return seconds, usage.ru_maxrss


def best(cmd: list[str], env: dict[str, str], repeats: int) -> float:
    return min(run(cmd, env)[0] for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-torch-cka", action="store_true")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS)
    simkit = str(Path(sys.executable).with_name("simkit"))
    work = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    compare = [simkit, "compare", "torchvision:resnet18", "torchvision:resnet34", "--data",
               "synthetic:3x64x64", "--n", str(args.n), "--batch-size", "64", "--layers-a", LAYERS,
               "--layers-b", LAYERS, "--metric", "linear_cka,unbiased_cka", "--mode", "minibatch",
               "--no-report", "--out", str(work / "run")]

    bare = best([sys.executable, "-c", BARE.format(n=args.n, threads=THREADS)], env, args.repeats)
    ours = best(compare, env, args.repeats)
    print(f"bare forwards   {bare:7.2f} s")
    print(f"simkit compare  {ours:7.2f} s   ratio {ours / bare:.3f}  (target <= 1.10)")
    if not args.skip_torch_cka:
        try:
            theirs = best([sys.executable, "-c", TORCH_CKA.format(n=args.n, threads=THREADS)], env, 1)
            print(f"torch-cka       {theirs:7.2f} s   ratio {theirs / bare:.3f}")
        except subprocess.CalledProcessError:
            print("torch-cka       not installed or failed (pip install torch-cka)")
    report = best([simkit, "report", str(work / "run")], env, 1)
    print(f"simkit report   {report:7.2f} s   (whole process)")
    if not args.skip_memory:
        peaks = {}
        for n in (1024, 8192):
            cmd = [simkit, "compare", "torchvision:resnet18", "torchvision:resnet34", "--data",
                   "synthetic:3x64x64", "--n", str(n), "--layers-a", LAYERS, "--layers-b", LAYERS,
                   "--mode", "exact", "--reduce", "mean", "--no-report", "--out", str(work / f"mem{n}")]
            peaks[n] = run(cmd, env)[1]
            print(f"exact mean n={n:5d} peak RSS {peaks[n] / 1024:8.1f} MiB")
        print(f"memory ratio n=8192 / n=1024: {peaks[8192] / peaks[1024]:.3f}  (target <= 1.2)")


if __name__ == "__main__":
    main()
