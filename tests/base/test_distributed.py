"""torchrun with 2 processes (gloo, CPU) gives the 1-process numbers to 1e-10."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
BIN = Path(sys.executable).parent


def simkit_compare(out: Path, extra: list[str], processes: int) -> pd.DataFrame:
    args = ["compare", "simkit:mlp:in_features=40,hidden=16,depth=3", "simkit:mlp:in_features=40,hidden=12,depth=2",
            "--data", "mnist1d", "--layers-a", "blocks", "--layers-b", "blocks", "--batch-size", "32",
            "--no-report", "--out", str(out), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if processes == 1:
        cmd = [str(BIN / "simkit"), *args]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={processes}", "--no-python",
               str(BIN / "simkit"), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return pd.read_csv(out / "similarity.csv")


@pytest.mark.skipif(shutil.which("torchrun", path=str(BIN)) is None, reason="torchrun not installed")
@pytest.mark.parametrize("extra", [
    ["--mode", "minibatch", "--num-samples", "200", "--null", "3"],
    ["--mode", "exact", "--num-samples", "200", "--metric", "linear_cka,unbiased_cka,rbf_cka,mutual_knn"],
    ["--mode", "minibatch", "--num-samples", "20"],  # one batch: the second rank gets none
], ids=["minibatch-null", "exact-all-metrics", "empty-rank"])
def test_two_processes_equal_one(tmp_path, extra):
    one = simkit_compare(tmp_path / "one", extra, 1)
    two = simkit_compare(tmp_path / "two", extra, 2)
    assert list(one.columns) == list(two.columns)
    for column in [c for c in one.columns if c in ("value", "null_mean", "null_p95")]:
        np.testing.assert_allclose(two[column], one[column], rtol=0, atol=1e-10, err_msg=column)
    result = json.loads((tmp_path / "two" / "result.json").read_text())
    assert result["meta"]["world_size"] == 2
    summary = result["summary"]
    assert summary["n"] == int(extra[extra.index("--num-samples") + 1])


@pytest.mark.skipif(shutil.which("torchrun", path=str(BIN)) is None, reason="torchrun not installed")
def test_training_runner_under_torchrun_follows_one_process(tmp_path):
    """`simkit linearize` (train + post-train through the shared loop) on 2 ranks vs 1.

    Tolerance 1e-4 relative on the logged losses: each rank back-propagates its half of every global
    batch and the float32 gradients are summed across ranks, so they add in another order than in one
    process. The model has no BatchNorm, whose batch statistics would differ by design when a batch is
    split over ranks. Only rank 0 writes the run directory.
    """
    args = ["linearize", "simkit:cnn2d:channels=4,layers=2,batchnorm=false", "--data", "digits",
            "--num-samples", "300", "--train", "1", "--epochs", "1", "--omega", "1e-2", "--granularity",
            "channel", "--batch-size", "64", "--no-cka", "--no-report"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    logs = {}
    for processes in (1, 2):
        out = tmp_path / f"p{processes}"
        prefix = [] if processes == 1 else [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2",
                                            "--no-python"]
        done = subprocess.run([*prefix, str(BIN / "simkit"), *args, "--out", str(out)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        logs[processes] = sorted(out.glob("*.log.csv"))
        assert (out / "runs.csv").is_file()
        assert json.loads((out / "result.json").read_text())["meta"]["world_size"] == processes
    assert [p.name for p in logs[1]] == [p.name for p in logs[2]] and logs[1]
    for one, two in zip(logs[1], logs[2], strict=True):
        a, b = pd.read_csv(one), pd.read_csv(two)
        assert len(a) == len(b) > 0
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4, err_msg=one.name)
