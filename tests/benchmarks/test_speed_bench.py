"""The GPU benchmark's CPU-side logic (CI never has a GPU): its no-GPU message, and a tiny run of the
same code on the CPU. Nothing here times anything."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import torch

from tests.helpers import ROOT


def bench_gpu():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_and_measures_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    results = tmp_path / "bench_gpu.txt"
    assert bench_gpu().main(["--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bench_gpu: no GPU here: torch.cuda.is_available() is False") and "nothing measured" in out
    assert out.count("\n") == 1 and not results.exists()


def test_no_gpu_message_as_a_process_has_no_traceback():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py")], capture_output=True,
                          text=True, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    if "no GPU here" in done.stdout:  # on a machine with a GPU it measures instead (not in CI)
        assert "Traceback" not in done.stderr and done.stdout.count("\n") == 1


def test_cpu_check_runs_every_figure(capsys, tmp_path):
    results = tmp_path / "bench_gpu.txt"
    code = bench_gpu().main(["--device", "cpu", "--n", "24", "--exact-n", "16", "--batch-size", "8", "--repeats", "1",
                             "--cpu-threads", "1", "--model-a", "simkit:cnn2d", "--model-b", "simkit:cnn2d",
                             "--data", "digits", "--layers", "blocks", "--results", str(results)])
    assert code == 0
    out = capsys.readouterr().out
    for label in ("bare forwards", "compare (default)", "compare exact, mean", "speed-up"):
        assert label in out, out
    assert "CPU (script check, not a GPU figure)" in out
    assert not results.exists()  # a CPU check is never a GPU figure
