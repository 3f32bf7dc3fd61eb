"""The report tests' shared fixture: one small real run of every report kind (tests/report/test_browser.py
opens them in Chromium, tests/report/test_figures_files.py writes their figures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import invoke


def _invoke(*args) -> None:
    """``invoke`` that must succeed."""
    result = invoke(*args)
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory):
    """One small real run of every report kind, through the command line: kind → run directory (made once
    for the session; a test that writes into a run copies it first)."""
    root = tmp_path_factory.mktemp("kinds")
    cnn = "simkit:cnn1d:channels=8,layers=3"
    _invoke("compare", cnn, "simkit:cnn1d:channels=16,layers=3", "--data", "mnist1d", "--n", "128",
            "--out", root / "compare")
    for k, channels in enumerate((4, 8, 16)):
        _invoke("capture", f"simkit:cnn1d:channels={channels},layers=2", "--data", "mnist1d", "--n", "64",
                "--reduce", "mean", "--out", root / f"cache{k}")
    _invoke("compare", *(root / f"cache{k}" for k in range(3)), "--out", root / "study")
    image = "simkit:cnn2d:channels=4,layers=2"
    _invoke("convert", image, "--recipe", "conv-to-mlp", "--data", "digits", "--n", "300", "--rank", "8",
            "--steps-per-stage", "3", "--finetune-epochs", "1", "--batch-size", "64", "--train-guide", "1",
            "--baselines", "scratch", "--out", root / "convert")
    _invoke("stitch", image, image, "--data", "digits", "--n", "120", "--steps", "4", "--iri-steps", "15",
            "--batch-size", "32", "--layer-a", "blocks.0", "--layer-b", "blocks.0", "--objective", "hlm", "--iri",
            "--out", root / "stitch", "--cache-dir", root / "iri-cache")
    _invoke("linearize", image, "--data", "digits", "--n", "200", "--train", "1", "--epochs", "1", "--omega", "1e-2",
            "--granularity", "channel", "--batch-size", "64", "--out", root / "linearize")
    _invoke("graft", "simkit:llama:d=16,blocks=2", "--steps", "8", "--n", "16", "--batch-size", "8",
            "--out", root / "graft")
    _invoke("trend", _checkpoints(root / "checkpoints", cnn), "--arch", cnn, "--data", "mnist1d", "--n", "64",
            "--out", root / "trend")
    return {kind: root / kind for kind in ("compare", "study", "convert", "stitch", "linearize", "graft", "trend")}


def _checkpoints(folder: Path, spec: str) -> Path:
    """Three state dicts of ``spec`` as checkpoints of steps 0, 10 and 20 (the weights of seeds 0, 1, 2)."""
    import torch

    from simkit.models import load_model

    folder.mkdir()
    for seed in range(3):
        torch.save(load_model(spec, seed=seed).state_dict(), folder / f"step_{10 * seed:04d}.pt")
    return folder
