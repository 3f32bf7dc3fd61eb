"""`--n` beyond the data (one warning, in the library and on the terminal) and `npy:` files that are not
.npy arrays (our own one-line error, never numpy's allow_pickle message)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simkit.data import load_data
from simkit.errors import SimkitError
from tests.helpers import invoke


def test_n_beyond_digits_warns_once_with_the_count():
    with pytest.warns(UserWarning, match=r"data 'digits' holds 1437 samples \(its training split; its test split "
                                         r"holds 360 more\), fewer than `n` 100000; using all 1437"):
        data = load_data("digits", n=100000)
    assert len(data) == 1437


def test_n_beyond_the_data_is_one_warning_line_on_the_terminal(tmp_path):
    out = tmp_path / "cache"
    result = invoke("capture", "simkit:mlp:in_features=64,hidden=8,depth=2", "--data", "digits", "--n", "100000",
                    "--out", str(out), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "fewer than" in line]
    assert lines == ["warning: data 'digits' holds 1437 samples (its training split; its test split holds 360 "
                     "more), fewer than --n 100000; using all 1437"]
    assert json.loads((out / "manifest.json").read_text())["n"] == 1437


def test_n_within_the_data_does_not_warn(recwarn):
    assert len(load_data("digits", n=100)) == 100
    assert not [w for w in recwarn if "fewer than" in str(w.message)]


def test_npy_of_a_text_file_is_our_own_line(tmp_path):
    path = tmp_path / "table.npy"
    path.write_text("1 2 3\n4 5 6\n")
    with pytest.raises(SimkitError) as caught:
        load_data(f"npy:{path}")
    message = str(caught.value)
    assert "allow_pickle" not in message and "\n" not in message
    assert "is not a .npy file (no NumPy header); save the array with np.save" in message


def test_npy_of_an_object_array_is_our_own_line(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(SimkitError, match=r"holds Python objects \(an object array\), which simkit does not "
                                          r"unpickle") as caught:
        load_data(f"npy:{path}")
    assert "allow_pickle" not in str(caught.value)


def test_npy_labels_of_a_text_file_too(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 2), dtype=np.float32))
    (tmp_path / "y.npy").write_text("0\n1\n2\n")
    with pytest.raises(SimkitError, match="is not a .npy file"):
        load_data(f"npy:{tmp_path / 'x.npy'},labels={tmp_path / 'y.npy'}")
