"""Suite-wide guards."""

from __future__ import annotations

import pytest

from simkit.training.denormals import denormals_flushed


@pytest.fixture(autouse=True)
def no_leaked_flush_denormal():
    """Flush-to-zero is process-wide: a test (or library code) that leaves it on breaks later ones."""
    yield
    assert not denormals_flushed(), "torch.set_flush_denormal(True) leaked out of the code under test"
