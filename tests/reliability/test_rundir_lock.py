"""A run directory belongs to one run at a time (issue #25).

``RunDir.start()`` takes an exclusive ``flock`` on ``<run dir>/.simkit.lock`` (holding the holder's pid
and start time) before its first write and keeps it until the run ends. These tests hold the lock in a
second, real process: a run into the same directory is refused with one line naming that process; once
the holder is killed (the kernel releases its flock, its lock file stays) the next run, fresh or
``--resume``, takes the stale lock over with a notice on stderr.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simkit.errors import SimkitError
from simkit.rundir import LOCK_FILE, RunDir, discard_unused_runs, release_locks, sha256
from tests.helpers import invoke
from tests.reliability.test_full_disk import stable

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")]

CNN = "simkit:cnn2d:channels=4,layers=2"
LINEARIZE = ["linearize", CNN, "--data", "digits", "--n", "120", "--epochs", "1", "--omega", "1e-2",
             "--granularity", "layer", "--batch-size", "64", "--no-cka", "--no-report"]
HOLDER = """
import json, sys
from simkit.rundir import RunDir
resume = sys.argv[2] == "resume"  # a resume checks inputs.json: hold a finished run with its own record
record = json.loads(open(sys.argv[1] + "/inputs.json").read()) if resume else {"options": {"holder": True}}
run = RunDir(sys.argv[1], "linearize", record["options"], resume=resume)
run.record = record if resume else run.record
run.start()
print("held", flush=True)
sys.stdin.read()  # hold the run directory until the test closes our stdin (or kills us)
run.close()
print("released", flush=True)
"""


class Holder:
    """Another process that starts a RunDir in ``out`` and holds it."""

    def __init__(self, out: Path, resume: bool = False):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), "resume" if resume else "fresh"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = self.proc.stdout.readline()
        assert line.strip() == "held", line + self.proc.stderr.read()
        self.pid = self.proc.pid

    def release(self) -> str:
        out, _ = self.proc.communicate("", timeout=60)
        return out

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=60)


def test_a_second_process_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    holder = Holder(out)
    try:
        record = json.loads((out / LOCK_FILE).read_text())
        assert record["pid"] == holder.pid and abs(record["started"] - time.time()) < 120
        inputs = (out / "inputs.json").read_bytes()
        # in this process (CliRunner): one line, exit 2, the holder's inputs.json untouched
        result = invoke(*LINEARIZE, "--out", out)
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --out "), result.output
        assert "in use by another run" in lines[0] and f"process {holder.pid}" in lines[0], lines[0]
        assert time.strftime("%Y-%m-%d", time.localtime(record["started"])) in lines[0], lines[0]
        assert (out / "inputs.json").read_bytes() == inputs
    finally:
        assert holder.release().strip() == "released"
    assert not (out / LOCK_FILE).exists(), "a released lock leaves no file behind"
    result = invoke(*LINEARIZE, "--out", out)  # free again
    assert result.exit_code == 0, result.output
    assert not (out / LOCK_FILE).exists()
    # a finished run held by a resume in another process: a real second process resuming it is refused
    holder = Holder(out, resume=True)
    try:
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != LOCK_FILE}
        done = subprocess.run([sys.executable, "-m", "simkit.cli.main", *LINEARIZE, "--resume", "--out", str(out)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"process {holder.pid}" in lines[0] and "in use" in lines[0], done.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != LOCK_FILE} == before
    finally:
        holder.release()


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume"])
def test_a_killed_holder_leaves_a_stale_lock_that_is_taken_over(tmp_path, resume):
    out = tmp_path / "run"
    if resume:  # a finished run to resume into
        assert invoke(*LINEARIZE, "--out", out).exit_code == 0
        summary = stable(json.loads((out / "result.json").read_text())["summary"])
    holder = Holder(out, resume=resume)
    holder.kill()
    stale = json.loads((out / LOCK_FILE).read_text())
    assert stale["pid"] == holder.pid, "the killed holder's lock file stays behind"
    args = [*LINEARIZE, *(["--resume"] if resume else []), "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "simkit.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if line.startswith("notice: taking over the stale lock")]
    assert len(notices) == 1 and f"process {holder.pid}" in notices[0], done.stderr
    assert not (out / LOCK_FILE).exists()
    if resume:
        assert stable(json.loads((out / "result.json").read_text())["summary"]) == summary


def test_the_lock_file_stays_out_of_digests_listings_and_results(tmp_path):
    out = tmp_path / "run"
    with RunDir(out, "linearize", {"a": 1}).start() as run:
        assert (out / LOCK_FILE).is_file() and run.started
        digest = sha256(out)
        (out / LOCK_FILE).write_text('{"pid": 1}')  # what the lock file holds changes no digest
        assert sha256(out) == digest
        discard_unused_runs()  # only inputs.json (and the lock): this process made it, so it goes
        assert not out.exists()
    release_locks()
    with RunDir(out, "linearize", {"a": 1}).start():
        (out / "result.json").write_text("{}")
        discard_unused_runs()
        assert out.is_dir()  # a run that wrote something stays
    assert sorted(p.name for p in out.iterdir()) == ["inputs.json", "result.json"]


def test_in_one_process_a_later_run_into_the_same_directory_takes_it(tmp_path):
    """A Python caller's runs one after the other (each runner starts its own RunDir) are not refused."""
    out = tmp_path / "run"
    first = RunDir(out, "linearize", {"a": 1}).start()
    held = (out / LOCK_FILE).read_bytes()
    RunDir(out, "linearize", {"a": 1}, resume=True).start()
    assert (out / LOCK_FILE).read_bytes() == held
    first.close()
    assert not (out / LOCK_FILE).exists()


def test_a_refused_start_creates_nothing(tmp_path):
    out = tmp_path / "run"
    holder = Holder(out)
    try:
        before = sorted(p.name for p in out.iterdir())
        with pytest.raises(SimkitError, match=f"in use by another run \\(process {holder.pid}"):
            RunDir(out, "linearize", {"a": 2}).start()
        assert sorted(p.name for p in out.iterdir()) == before
    finally:
        holder.release()


@pytest.mark.parametrize("command", [
    ["compare", "simkit:mlp:in_features=40,hidden=8,depth=2", "simkit:mlp:in_features=40,hidden=6,depth=1",
     "--data", "mnist1d", "--n", "32"],
    ["capture", "simkit:mlp:in_features=40,hidden=8,depth=2", "--data", "mnist1d", "--n", "32"],
])
def test_compare_and_capture_refuse_a_directory_another_run_holds(tmp_path, command):
    """The issue's case: two commands into one --out at once; the second is refused, nothing mixed."""
    out = tmp_path / "shared"
    holder = Holder(out)
    try:
        before = sorted(p.name for p in out.iterdir())
        result = invoke(*command, "--out", out)
        assert result.exit_code == 2, result.output
        line = result.output.strip()
        assert "\n" not in line and f"process {holder.pid}" in line
        assert sorted(p.name for p in out.iterdir()) == before  # nothing of the refused run was written
    finally:
        holder.release()
    assert invoke(*command, "--out", out).exit_code == 0  # once the holder is gone the directory is free
    assert not (out / LOCK_FILE).exists()
