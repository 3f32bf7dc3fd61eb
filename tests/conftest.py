"""Suite-wide guards and shared fixtures (plain helpers to import are in tests/helpers.py)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

from simkit.training.denormals import denormals_flushed

#: CI (``.ci/run`` sets ``CI``) draws the same hypothesis examples on every run, so a submission's verdict
#: is the one its author saw on a fresh clone; a plain ``pytest`` (and the fuzz's deep profile) draws anew,
#: and a case found that way becomes a named test (tests/reliability/test_library_fuzz.py, "open breaches").
settings.register_profile("simkit-ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("simkit-ci")


@pytest.fixture(autouse=True)
def no_leaked_flush_denormal():
    """Flush-to-zero is process-wide: a test (or library code) that leaves it on breaks later ones."""
    yield
    assert not denormals_flushed(), "torch.set_flush_denormal(True) leaked out of the code under test"


@pytest.fixture(scope="module")
def data_spec(tmp_path_factory):
    """Tiny labelled 8×8 images as .npy files (a data spec that loads without scikit-learn)."""
    import numpy as np

    folder = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    x = rng.random((150, 1, 8, 8)).astype(np.float32)
    y = (x[:, 0, :4].sum((1, 2)) > x[:, 0, 4:].sum((1, 2))).astype(np.int64)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return f"npy:{folder / 'x.npy'},labels={folder / 'y.npy'}"


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for the whole module (tiny models: one thread is faster, and much faster when
    the cores are busy). A module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
