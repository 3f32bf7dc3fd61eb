"""examples/svcca_convergence.py: a smoke run (2 seeds, 1 epoch) writes its note with per-seed stabilisation
steps, the gate and both verdicts; the caution about layers stable from step 0 is computed from the runs."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import ROOT

PATH = ROOT / "examples" / "svcca_convergence.py"
pytestmark = pytest.mark.usefixtures("one_thread")


def example():
    spec = importlib.util.spec_from_file_location("svcca_convergence_example", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_the_note(tmp_path, monkeypatch):
    module = example()
    note = tmp_path / "note.md"
    monkeypatch.setattr(sys, "argv", ["svcca", "--seeds", "2", "--epochs", "1", "--every", "8",
                                      "--out", str(tmp_path / "runs"), "--results", str(note)])
    module.main()
    text = note.read_text()
    assert "| 0 |" in text and "| 1 |" in text and "Gate (every seed" in text
    assert "head − blocks.0 stabilisation step > 0" in text and "ρ(depth, stabilisation step) > 0" in text
    assert (tmp_path / "runs" / "seed0" / "report.html").is_file()


def test_the_caution_names_layers_stable_from_the_start():
    module = example()
    runs = [{"steps": [0, 16, 32, 48, 64, 80]}, {"steps": [0, 32, 32, 48, 96, 96]}]
    lines = module.immediate_layers(runs)
    assert "blocks.0 stayed within δ" in lines[1] and "head − blocks.1" in lines[2]
    assert module.immediate_layers([{"steps": [16, 16, 32, 48, 64, 80]}]) == []
