"""`simkit layers` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from simkit.cli.main import app

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args))


def test_layers_json_with_shapes():
    result = _invoke("layers", "simkit:cnn1d:channels=8,layers=2", "--data", "mnist1d", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["blocks.1"]["shape"] == "8x40" and rows["blocks.1"]["blocks"] is True
    assert rows["head"]["shape"] == "10" and rows["head"]["params"] == 8 * 40 * 10 + 10
    assert rows["blocks.0.conv"]["type"] == "Conv1d" and rows["blocks.0.conv"]["blocks"] is False


def test_layers_select_and_table():
    result = _invoke("layers", "torchvision:resnet18", "--data", "synthetic:3x32x32", "--select", "layer*.?")
    assert result.exit_code == 0, result.output
    for name in ("layer1.0", "layer4.1", "BasicBlock", "512x1x1"):
        assert name in result.stdout
    assert "layer1.0.conv1" not in result.stdout and "fc" not in result.stdout.split("layers of")[1]


def test_layers_without_data_uses_the_models_example_input():
    result = _invoke("layers", "simkit:mlp:depth=1,hidden=16", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [row["name"] for row in rows] == [
        "flatten", "blocks", "blocks.0", "blocks.0.fc", "blocks.0.bn", "blocks.0.relu", "head"]
    assert rows[0]["shape"] == "40" and rows[2]["shape"] == "16"
    assert "example_input()" in result.stderr


def test_layers_without_data_or_example_has_no_shapes():
    result = _invoke("layers", "simkit:llama:d=8,heads=2,blocks=1,max_len=4", "--json")
    assert result.exit_code == 0, result.output
    assert {row["shape"] for row in json.loads(result.stdout)} == {""}
    assert "pass --data SPEC" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["simkit:cnn9"], "unknown zoo model 'cnn9'"),
    (["simkit:cnn1d", "--select", "blocks.7"], "unknown layer 'blocks.7'; closest:"),
    (["simkit:cnn1d", "--data", "digits"], "cannot run on one sample of 'digits'"),
    (["simkit:cnn1d", "--data", "nope"], "unknown data kind 'nope'"),
])
def test_layers_bad_input_exit_2(args, message):
    result = _invoke("layers", *args)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


def test_layers_pickle_needs_trust(tmp_path):
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), tmp_path / "m.pt")
    result = _invoke("layers", f"file:{tmp_path}/m.pt")
    assert result.exit_code == 2 and "pass --trust" in result.stderr
    trusted = _invoke("layers", f"file:{tmp_path}/m.pt", "--trust", "--json")
    assert trusted.exit_code == 0 and json.loads(trusted.stdout)[0]["name"] == "0"
