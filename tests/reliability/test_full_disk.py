"""A full disk loses nothing (issue #25): a checkpoint, a table or the report that cannot be written
(ENOSPC, EDQUOT, EFBIG) stops the command with one line naming the file and the cause (exit 2); the
earlier checkpoint and files stay intact, no temporary file is left behind, and a resumed run afterwards
ends bit-identical to a run that never met the fault.

Faults are injected at the one place every file simkit writes goes through: ``simkit.io._fill``, which
fills the temporary file that ``atomic_write`` then renames into place. The fake writes the real bytes,
cuts them in half (what a full disk leaves) and raises the OSError.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

import simkit.io
from simkit.errors import SimkitError
from simkit.io import WriteError, atomic_write, save_torch, write_json, write_text
from simkit.rundir import _complete_torch_file
from tests.helpers import invoke

pytestmark = pytest.mark.usefixtures("one_thread")

CNN = "simkit:cnn2d:channels=4,layers=2"
LINEARIZE = ["linearize", CNN, "--data", "digits", "--n", "200", "--epochs", "1", "--omega", "1e-2,1e-1",
             "--granularity", "layer", "--batch-size", "64", "--no-cka"]
CAUSES = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded", errno.EFBIG: "File too large"}
INJECTED: list[str] = []  # the files a fault was injected into, over the module


def full_disk(monkeypatch, matches, code=errno.ENOSPC):
    """From now on, a write whose target name ``matches`` fills half its temporary file and fails with
    OSError(``code``); returns the list of the target names it failed."""
    real = simkit.io._fill
    failed: list[str] = []

    def fill(write, tmp):
        target = tmp.name[1:].rsplit(".", 2)[0]  # ".<name>.<random>.tmp" -> <name>
        real(write, tmp)
        if matches(target):
            size = tmp.stat().st_size
            with open(tmp, "r+b") as handle:
                handle.truncate(size // 2)
            failed.append(target)
            INJECTED.append(target)
            raise OSError(code, os.strerror(code))

    monkeypatch.setattr(simkit.io, "_fill", fill)
    return failed


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.tmp"))


# ---------------------------------------------------------------------------- the atomic write itself


@pytest.mark.parametrize("code", list(CAUSES), ids=[errno.errorcode[c] for c in CAUSES])
@pytest.mark.parametrize("writer", ["text", "json", "torch", "csv"])
def test_a_failed_write_keeps_the_earlier_file_and_names_the_file_and_cause(tmp_path, monkeypatch, code, writer):
    path = tmp_path / f"file.{writer}"
    write = {"text": lambda p, v: write_text(p, f"version {v}\n"),
             "json": lambda p, v: write_json(p, {"version": v}),
             "torch": lambda p, v: save_torch(p, {"version": torch.full((100,), float(v))}),
             "csv": lambda p, v: simkit.io.write_csv(p, pd.DataFrame({"version": [v] * 10}))}[writer]
    write(path, 1)
    before = path.read_bytes()
    failed = full_disk(monkeypatch, lambda name: True, code)
    with pytest.raises(SimkitError) as caught:
        write(path, 2)
    message = str(caught.value)
    assert failed == [path.name]
    assert isinstance(caught.value, WriteError) and isinstance(caught.value, OSError)  # a cache may skip it
    assert caught.value.errno == code and caught.value.filename == str(path)
    assert str(path) in message and CAUSES[code] in message and errno.errorcode[code] in message, message
    assert "\n" not in message
    assert path.read_bytes() == before, "the earlier file was touched"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "a temporary file was left behind"


def test_a_failure_that_is_no_oserror_passes_through_and_leaves_nothing(tmp_path):
    def broken(p):
        p.write_text("half")
        raise TypeError("not JSON")

    with pytest.raises(TypeError):
        atomic_write(tmp_path / "r.json", broken)
    assert list(tmp_path.iterdir()) == []


def test_no_room_for_the_temporary_file_itself(tmp_path, monkeypatch):
    def no_inode(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(simkit.io.tempfile, "mkstemp", no_inode)
    with pytest.raises(WriteError, match="r.json: No space left on device"):
        write_json(tmp_path / "r.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- a command on a full disk


def tables(out: Path) -> dict[str, pd.DataFrame]:
    """Every CSV of a run directory, without the columns that wall-clock time decides."""
    frames = {}
    for path in sorted(out.glob("*.csv")):
        frame = pd.read_csv(path)
        frames[path.name] = frame.drop(columns=[c for c in frame.columns if "time" in c or "second" in c])
    return frames


def stable(value):
    """``value`` without what wall-clock time decides (keys naming a time or seconds), at any depth."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if "time" not in k and "second" not in k}
    return [stable(v) for v in value] if isinstance(value, list) else value


def summary(out: Path) -> dict:
    return stable(json.loads((out / "result.json").read_text())["summary"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The run that never met a full disk."""
    out = tmp_path_factory.mktemp("reference") / "run"
    result = invoke(*LINEARIZE, "--out", out)
    assert result.exit_code == 0, result.output
    return out


# what fails: the second checkpoint, a table, the report (each with another cause)
FAULTS = {
    "checkpoint": (lambda name: name == "linearize_layer_w0.1.pt", errno.ENOSPC, "checkpoints/linearize_layer_w0.1.pt"),
    "table": (lambda name: name == "layers.csv", errno.EDQUOT, "layers.csv"),
    "report": (lambda name: name == "report.html", errno.EFBIG, "report.html"),
}


@pytest.mark.parametrize("what", list(FAULTS))
def test_a_full_disk_stops_with_one_line_and_a_resume_is_bit_identical(reference, tmp_path, monkeypatch, what):
    matches, code, named = FAULTS[what]
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        failed = full_disk(patch, matches, code)
        result = invoke(*LINEARIZE, "--out", out)
    assert failed, f"no write of the {what} was attempted"
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: cannot write "), result.output
    assert "Traceback" not in result.output
    assert str(out / named) in lines[0] and CAUSES[code] in lines[0], lines[0]
    assert "--resume" in lines[0], lines[0]  # the library's `resume`, as the command's flag
    assert leftovers(out) == [], "a temporary file was left behind"
    assert not (out / ".simkit.lock").exists(), "the run directory is still locked"
    # the earlier checkpoints are complete torch files, the one that failed is absent (never half there)
    checkpoints = sorted((out / "checkpoints").glob("*.pt"))
    assert checkpoints and all(_complete_torch_file(p) for p in checkpoints)
    if what == "checkpoint":
        assert [p.name for p in checkpoints] == ["linearize_layer_w0.01.pt"]
        kept = (out / "checkpoints" / "linearize_layer_w0.01.pt").read_bytes()
    resumed = invoke(*LINEARIZE, "--resume", "--out", out)
    assert resumed.exit_code == 0, resumed.output
    if what == "checkpoint":
        assert (out / "checkpoints" / "linearize_layer_w0.01.pt").read_bytes() == kept  # not redone
    assert leftovers(out) == []
    mine, theirs = tables(out), tables(reference)
    assert sorted(mine) == sorted(theirs)
    for name, frame in theirs.items():  # bit-identical: every loss, slope and count, no tolerance
        pd.testing.assert_frame_equal(mine[name], frame, check_exact=True, obj=name)
    assert summary(out) == summary(reference)
    assert (out / "report.html").is_file()


def test_faults_were_injected():
    """The figure for the issue: how many writes failed on purpose in this module (unit cases + commands)."""
    assert len(INJECTED) >= 4 * 3 + 3
    print(f"\nfaults injected: {len(INJECTED)}")


# ---------------------------------------------------------------------------- a real size-limited tmpfs


def _small_tmpfs(path: Path) -> bool:
    path.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def test_a_real_full_tmpfs(tmp_path):
    """Where a 1 MiB tmpfs can be mounted (root, a kernel that allows it): a write that does not fit fails
    with ENOSPC as a one-line WriteError, the earlier file intact, nothing left behind."""
    disk = tmp_path / "disk"
    if not _small_tmpfs(disk):
        pytest.skip("cannot mount a size-limited tmpfs here")
    try:
        write_text(disk / "a.txt", "earlier\n")
        with pytest.raises(WriteError, match="No space left on device") as caught:
            save_torch(disk / "a.txt", torch.zeros(2**19))  # 2 MiB
        assert caught.value.errno == errno.ENOSPC
        assert (disk / "a.txt").read_text() == "earlier\n"
        assert sorted(p.name for p in disk.iterdir()) == ["a.txt"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_training_log_that_cannot_grow_is_one_line_naming_it(tmp_path):
    """The loss log is appended row by row (not an atomic write): a full disk there is a WriteError too."""
    import errno as errnos

    from simkit.io import WriteError
    from simkit.training.state import MetricsLog

    log = MetricsLog(tmp_path / "fit.log.csv", keep_until=None)
    log.write(1, 0.5, 1e-3)

    class Full:
        def writerow(self, row):
            raise OSError(errnos.ENOSPC, "No space left on device")

    log._writer = Full()
    with pytest.raises(WriteError, match=r"cannot write .*fit\.log\.csv: No space left on device \(ENOSPC\)"):
        log.write(2, 0.4, 1e-3)
    log.close()
    assert (tmp_path / "fit.log.csv").read_text().splitlines()[1].startswith("1,")
