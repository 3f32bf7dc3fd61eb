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
    summary = json.loads((tmp_path / "two" / "result.json").read_text())["summary"]
    assert summary["n"] == int(extra[extra.index("--num-samples") + 1])
