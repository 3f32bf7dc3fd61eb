"""A kill at any phase leaves nothing that looks complete (issue #37).

A first run completes into ``--out``; a second run into the same directory is killed (SIGKILL, through the
``simkit.faults`` hook ``SIMKIT_KILL_AT``) at each named phase of compare, capture, study and a report
render. Afterwards the directory is either the first run, untouched (``simkit.load`` gives its values), or
clearly incomplete (``simkit.load`` refuses it in one line; a cache without its manifest is refused as a
cache) — never a ``result.json`` beside another run's tables. The next run then completes (the dead run's
lock is stale and taken over).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import simkit
from simkit.errors import SimkitError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

MLP_A = "simkit:mlp:in_features=40,hidden=8,depth=2"
MLP_B = "simkit:mlp:in_features=40,hidden=6,depth=2"
DATA = ["--data", "mnist1d", "--n", "64", "--batch-size", "32"]


def simkit_cli(*args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("SIMKIT_KILL_AT", None)
    if kill_at is not None:
        env["SIMKIT_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "simkit.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def compare_args(out: Path, seed: str) -> list[str]:
    return ["compare", MLP_A, MLP_B, *DATA, "--seed", seed, "--metric", "linear_cka,rsa", "--out", str(out)]


def snapshot(out: Path) -> dict[str, pd.DataFrame] | None:
    """The run ``simkit.load`` reads from ``out`` (its tables), or None when it refuses an incomplete one."""
    try:
        result = simkit.load(out)
    except SimkitError as exc:
        assert "\n" not in str(exc)
        return None
    return result.tables


def same_tables(got: dict[str, pd.DataFrame], want: dict[str, pd.DataFrame]) -> None:
    assert sorted(got) == sorted(want)
    for name, frame in want.items():
        pd.testing.assert_frame_equal(got[name], frame, obj=name)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kill") / "run"
    done = simkit_cli(*compare_args(out, "0"))
    assert done.returncode == 0, done.stderr
    return out, simkit.load(out).tables


@pytest.mark.parametrize("phase", ["loading", "streaming", "computing", "writing", "rendering"])
def test_compare_killed_at_each_phase_leaves_the_earlier_run_or_nothing_complete(tmp_path, first_run, phase):
    source, tables = first_run
    out = tmp_path / "run"
    out.mkdir()
    for item in source.iterdir():
        (out / item.name).write_bytes(item.read_bytes())
    killed = simkit_cli(*compare_args(out, "1"), kill_at=phase)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = snapshot(out)  # every phase ends before the commit (a few renames): the earlier run as it was
    assert left is not None
    same_tables(left, tables)
    if phase == "writing":
        again = simkit_cli(*compare_args(out, "1"))
        assert again.returncode == 0, again.stderr
        assert snapshot(out) is not None and not list(out.glob(".*.staged"))  # the dead run's files cleared


def test_a_table_of_another_run_is_refused(tmp_path, first_run):
    source, _ = first_run
    out = tmp_path / "run"
    out.mkdir()
    for item in source.iterdir():
        (out / item.name).write_bytes(item.read_bytes())
    frame = pd.read_csv(out / "similarity.csv")
    frame.loc[0, "value"] = 0.123
    frame.to_csv(out / "similarity.csv", index=False)
    with pytest.raises(SimkitError, match="mixes two runs"):
        simkit.load(out)


def test_capture_killed_while_writing_shards_is_not_a_cache(tmp_path):
    out = tmp_path / "cache"
    assert simkit_cli("capture", MLP_A, *DATA, "--out", str(out)).returncode == 0
    killed = simkit_cli("capture", MLP_A, *DATA, "--seed", "1", "--out", str(out), kill_at="capturing")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "manifest.json").exists()  # the earlier cache stopped being one at the first write
    refused = simkit_cli("compare", str(out), str(out), "--out", str(tmp_path / "cmp"))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert simkit_cli("capture", MLP_A, *DATA, "--seed", "1", "--out", str(out)).returncode == 0


def test_study_killed_while_writing_leaves_the_earlier_study_or_nothing(tmp_path):
    caches = []
    for i, spec in enumerate((MLP_A, MLP_B, MLP_A)):
        caches.append(str(tmp_path / f"c{i}"))
        assert simkit_cli("capture", spec, *DATA, "--seed", str(i), "--out", caches[-1]).returncode == 0
    out = tmp_path / "study"
    assert simkit_cli("compare", *caches, "--out", str(out)).returncode == 0
    before = simkit.load(out).tables
    killed = simkit_cli("compare", *caches, "--metric", "linear_cka", "--out", str(out), kill_at="writing")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = snapshot(out)
    assert left is not None
    same_tables(left, before)


def test_report_render_killed_keeps_the_earlier_report(tmp_path, first_run):
    source, _ = first_run
    out = tmp_path / "run"
    out.mkdir()
    for item in source.iterdir():
        (out / item.name).write_bytes(item.read_bytes())
    report = (out / "report.html").read_bytes()
    killed = simkit_cli("report", str(out), kill_at="rendering")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / "report.html").read_bytes() == report
