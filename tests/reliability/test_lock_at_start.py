"""A run directory belongs to its run from the first moment (issue #37): every command that writes into
``--out`` takes its lock before the first model is loaded, so a second run into a busy directory is refused
at once, even while the first is still loading; a run that fails before writing leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simkit.rundir import LOCK_FILE
from tests.helpers import invoke

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")]

SLOW_MODEL = '''
import sys, time
from torch import nn

def build():
    print("loading", flush=True)
    time.sleep(120)  # a model that takes long to load: the run holds --out meanwhile
    return nn.Linear(40, 4)
'''
MLP = "simkit:mlp:in_features=40,hidden=8,depth=2"


def start_slow_run(tmp_path: Path, out: Path) -> subprocess.Popen:
    (tmp_path / "slowmodel.py").write_text(SLOW_MODEL)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "simkit.cli.main", "compare", "python:slowmodel:build", MLP,
                             "--data", "mnist1d", "--n", "32", "--no-report", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.strip() == "loading", line + proc.stderr.read()
    return proc


@pytest.mark.parametrize("second", [
    ["compare", MLP, MLP, "--data", "mnist1d", "--n", "32", "--no-report"],
    ["capture", MLP, "--data", "mnist1d", "--n", "32"],
    ["linearize", "simkit:cnn1d:channels=4,layers=2", "--data", "mnist1d", "--n", "32", "--epochs", "1",
     "--no-report"],
])
def test_a_run_still_loading_holds_its_out_against_a_second_run(tmp_path, second):
    out = tmp_path / "busy"
    first = start_slow_run(tmp_path, out)
    try:
        assert (out / LOCK_FILE).is_file()  # taken before the model finished loading
        result = invoke(*second, "--out", out)
        assert result.exit_code == 2, result.output
        line = result.output.strip()
        assert "\n" not in line and f"process {first.pid} (`simkit compare`)" in line and "in use" in line
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # the refused run wrote nothing
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)


def test_a_run_that_fails_before_writing_leaves_no_directory(tmp_path):
    out = tmp_path / "new" / "run"
    result = invoke("compare", MLP, "simkit:no-such-model", "--data", "mnist1d", "--n", "32", "--out", out)
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "new").exists()


def test_an_existing_directory_keeps_its_files_when_a_run_fails_early(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = invoke("compare", MLP, "simkit:no-such-model", "--data", "mnist1d", "--n", "32", "--out", out)
    assert result.exit_code == 2, result.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_the_lock_is_released_when_the_first_run_ends(tmp_path):
    out = tmp_path / "run"
    assert invoke("compare", MLP, MLP, "--data", "mnist1d", "--n", "32", "--no-report", "--out", out).exit_code == 0
    started = time.time()
    result = invoke("compare", MLP, MLP, "--data", "mnist1d", "--n", "32", "--no-report", "--out", out)
    assert result.exit_code == 0 and time.time() - started < 120
    assert not (out / LOCK_FILE).exists()


TORCHRUN = Path(sys.executable).parent / "torchrun"


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed")
def test_a_busy_out_is_refused_at_once_under_torchrun(tmp_path):
    """Two ranks into a directory a run still loading holds: rank 0 takes the lock, is refused in one line
    naming the holder, and the job ends (no rank waits for a peer that will never come)."""
    out = tmp_path / "busy"
    first = start_slow_run(tmp_path, out)
    try:
        cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "--no-python",
               str(Path(sys.executable).parent / "simkit"), "compare", MLP, MLP, "--data", "mnist1d",
               "--num-samples", "32", "--no-report", "--out", str(out)]
        started = time.time()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode != 0 and time.time() - started < 120, done.stderr[-2000:]
        refusals = [line for line in (done.stdout + done.stderr).splitlines()
                    if f"process {first.pid} (`simkit compare`)" in line and "in use" in line]
        assert refusals, done.stdout[-2000:] + done.stderr[-2000:]
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # the refused job wrote nothing
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
