"""Atomic writes and strict JSON."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from simkit.io import write_json, write_text


def test_json_is_strict_nan_and_inf_become_null(tmp_path):
    path = write_json(tmp_path / "r.json", {"a": float("nan"), "b": np.float32(np.inf), "c": np.array([1.0, np.nan]),
                                            "d": torch.tensor([2.0]), "e": (1, 2)})
    data = json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"non-strict JSON: {name}"))
    assert data == {"a": None, "b": None, "c": [1.0, None], "d": [2.0], "e": [1, 2]}


def test_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(TypeError):
        write_json(tmp_path / "r.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_written_files_get_the_usual_permissions(tmp_path):
    path = write_text(tmp_path / "report.html", "<p>hi</p>")
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
