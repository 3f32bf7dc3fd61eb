"""Bad activation files through `simkit compare FILE FILE` and `simkit capture --from`: each is one line,
exit code 2, no traceback and no run directory left behind; hostile layer names and IDs (markup, paths,
control characters, very long) are escaped in the report and never become paths."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
import torch

from tests.helpers import invoke

pytestmark = pytest.mark.usefixtures("one_thread")

RNG = np.random.default_rng(0)
GOOD = RNG.normal(size=(30, 4)).astype(np.float32)


class NotATensor:
    """Pickled into a .pt file: loading it needs this class (code), not just tensors."""


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def _object_npy(path):
    np.save(path, np.array([np.zeros(3), np.zeros(5)], dtype=object), allow_pickle=True)
    return path


def _truncated_npz(path):
    _npz(path, x=RNG.normal(size=(300, 50)))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _pickle_as_pt(path):
    path.write_bytes(pickle.dumps({"x": GOOD}))
    return path


def _code_pt(path):
    torch.save({"x": torch.tensor(GOOD), "extra": NotATensor()}, path)
    return path


def _h5(path):
    import h5py

    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", data=GOOD)
    return path


def _empty_dir(path):
    path.mkdir()
    (path / "notes.txt").write_text("no arrays here")
    return path


#: name → (make the file A from a path, what the error line must say)
CASES = {
    "object npy": (lambda p: _object_npy(p / "a.npy"), "object array"),
    "object npz": (lambda p: _npz(p / "a.npz", x=np.array([[1], [1, 2]], dtype=object)), "object array"),
    "text values": (lambda p: _npz(p / "a.npz", x=np.array([["a"] * 4] * 30)), "not numbers"),
    "complex values": (lambda p: _npz(p / "a.npz", x=GOOD.astype(np.complex64)), "not numbers"),
    "nan": (lambda p: _npz(p / "a.npz", x=np.where(np.arange(30)[:, None] == 17, np.nan, GOOD)),
            "layer 'x' of .* holds NaN or inf, first at row 17"),
    "inf": (lambda p: _npz(p / "a.npz", x=np.where(np.arange(30)[:, None] >= 29, np.inf, GOOD)), "first at row 29"),
    "one-dimensional": (lambda p: _npz(p / "a.npz", x=GOOD[:, 0]), r"has shape \(30,\)"),
    "empty layer": (lambda p: _npz(p / "a.npz", x=np.zeros((30, 0), np.float32)), "is empty"),
    "no samples": (lambda p: _npz(p / "a.npz", x=np.zeros((0, 4), np.float32)), "is empty"),
    "rows differ": (lambda p: _npz(p / "a.npz", x=GOOD[:20]), "different numbers of samples.*give IDs"),
    "layers' rows differ": (lambda p: _npz(p / "a.npz", x=GOOD, y=GOOD[:10]), "hold different numbers of samples"),
    "duplicate ids": (lambda p: _npz(p / "a.npz", x=GOOD, ids=np.array(["s1"] * 30)), "name sample 's1' twice"),
    "ids count": (lambda p: _npz(p / "a.npz", x=GOOD, ids=np.arange(12)), "list 12 samples"),
    "truncated npz": (lambda p: _truncated_npz(p / "a.npz"), "truncated"),
    "pickle as pt": (lambda p: _pickle_as_pt(p / "a.pt"), "not a torch.save file"),
    "pt with code": (lambda p: _code_pt(p / "a.pt"), "needs unpickling code.*--trust"),
    "no arrays in directory": (lambda p: _empty_dir(p / "dir"), "holds no .npy arrays"),
    "missing file": (lambda p: p / "gone.npz", "does not exist"),
}


def assert_refused(result, out, pattern: str) -> None:
    import re

    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: "), result.output
    assert "Traceback" not in result.output
    assert re.search(pattern, result.output), result.output
    assert not out.exists()


@pytest.mark.parametrize("case", CASES)
def test_bad_activations_are_one_line(tmp_path, case):
    make, pattern = CASES[case]
    bad = make(tmp_path)
    good = _npz(tmp_path / "good.npz", x=GOOD, ids=np.array([f"s{i}" for i in range(30)]))
    out = tmp_path / "run"
    assert_refused(invoke("compare", bad, good, "--out", out), out, pattern)
    assert_refused(invoke("capture", "--from", bad, "--out", out), out, pattern) if case not in (
        "rows differ", "ids count") else None


def test_hdf5_without_h5py_names_the_extra(tmp_path, monkeypatch):
    path = _h5(tmp_path / "a.h5")
    monkeypatch.setitem(sys.modules, "h5py", None)  # as if the [h5] extra were not installed
    out = tmp_path / "run"
    assert_refused(invoke("compare", path, path, "--out", out), out, r"needs h5py.*pip install 'simkit\[h5\]'")


@pytest.mark.parametrize(("args", "pattern"), [
    (["--ids-column", "x"], "--ids-column names the ID column"),
    (["--dtype", "bfloat16"], "--dtype loads models"),
    (["--min-overlap", "1.5"], "--min-overlap must be"),
])
def test_options_that_do_not_fit_activations(tmp_path, args, pattern):
    a = _npz(tmp_path / "a.npz", x=GOOD)
    out = tmp_path / "run"
    assert_refused(invoke("compare", a, a, "--out", out, *args), out, pattern)


def test_too_little_overlap_is_refused(tmp_path):
    a = _npz(tmp_path / "a.npz", x=GOOD, ids=np.arange(30))
    b = _npz(tmp_path / "b.npz", x=GOOD, ids=np.arange(5, 35))  # 25 of 30 shared: 83 %
    out = tmp_path / "run"
    assert_refused(invoke("compare", a, b, "--out", out), out, "only 25 sample IDs.*--min-overlap 0.9")
    assert invoke("compare", a, b, "--out", out, "--min-overlap", "0.8", "--no-report").exit_code == 0


HOSTILE = ["<script>alert('layer')</script>", "../../escape", "/etc/passwd", "tab\there\x07bell\x1b[31m",
           "$x^$", "$\\frac{", "L" * 3000]


def test_hostile_names_and_ids_are_escaped_and_never_paths(tmp_path):
    layers = {name: GOOD + RNG.normal(size=GOOD.shape).astype(np.float32) * i for i, name in enumerate(HOSTILE)}
    ids = np.array([f"<img src=x onerror=alert({i})>/../{i}" for i in range(30)])
    a = _npz(tmp_path / "a.npz", **{**layers, "ids": ids})
    work = tmp_path / "work"
    work.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    out = work / "run"
    result = invoke("compare", a, a, "--out", out, "--metric", "linear_cka", "--null", "10")
    assert result.exit_code == 0, result.output
    cache = invoke("capture", "--from", a, "--out", work / "cache")
    assert cache.exit_code == 0, cache.output
    figures = invoke("report", out, "--figures", "png,svg")  # layer names on matplotlib's axes, as text
    assert figures.exit_code == 0, figures.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written beside --out
    assert sorted(p.name for p in work.iterdir()) == ["cache", "run"]
    assert not any("escape" in str(p) or "passwd" in str(p) for p in work.rglob("*"))
    html = (out / "report.html").read_text()
    assert "<script>alert(" not in html and "&lt;script&gt;alert(" in html
    assert "\x1b" not in html and "\x07" not in html and "<img src=x" not in html
    import pandas as pd

    names = list(pd.read_csv(out / "layers.csv")["name"])
    assert "tab\\x09here\\x07bell\\x1b[31m" in names and "../../escape" in names
