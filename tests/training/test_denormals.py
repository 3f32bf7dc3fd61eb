"""flush_denormals is scoped: on inside, restored after, also after an error."""

from __future__ import annotations

import pytest
import torch

from simkit.training.denormals import denormals_flushed, flush_denormals


def test_flush_is_scoped_and_restored():
    assert not denormals_flushed()
    with flush_denormals():
        assert denormals_flushed()
    assert not denormals_flushed()


def test_restored_after_an_error_and_when_already_on():
    with pytest.raises(KeyError), flush_denormals():
        raise KeyError("x")
    assert not denormals_flushed()
    torch.set_flush_denormal(True)
    try:
        with flush_denormals():
            pass
        assert denormals_flushed()
    finally:
        torch.set_flush_denormal(False)
