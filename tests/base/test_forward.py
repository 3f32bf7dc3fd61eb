"""Data that does not fit the model is a one-line error (exit 2) in every command, never a traceback."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import simkit.cli.main  # noqa: F401  (registers the commands)
from simkit import SimkitError
from simkit.cli.common import app
from simkit.forward import check_accepts

runner = CliRunner()


def test_check_accepts_names_the_input_shape():
    with pytest.raises(SimkitError, match=r"model A failed on inputs of shape \(2, 3\): .*`data`"):
        check_accepts(nn.Linear(5, 2), torch.zeros(2, 3), "model A")
    check_accepts(nn.Linear(5, 2), torch.zeros(2, 5), "model A")


@pytest.mark.parametrize("args", [
    ["stitch", "simkit:cnn1d", "simkit:cnn1d", "--layers", "auto", "--steps", "2"],
    ["convert", "simkit:cnn1d", "--steps-per-stage", "2", "--finetune-epochs", "1"],
    ["graft", "simkit:cnn1d", "--after", "blocks.0", "--steps", "8"],
    ["compare", "simkit:cnn1d", "simkit:cnn1d"],
], ids=["stitch", "convert", "graft", "compare"])
def test_runners_reject_data_of_the_wrong_shape(tmp_path, args):
    result = runner.invoke(app, [*args, "--data", "digits", "--n", "100", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "failed on inputs of shape" in result.output and "Traceback" not in result.output
