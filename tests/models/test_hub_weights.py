"""``torchvision:NAME:weights=DEFAULT`` from a prepared torch hub cache, never a download (issue #26)."""

from __future__ import annotations

import json
import os
from urllib.parse import urlparse

import pytest
import torch
import torchvision
from typer.testing import CliRunner

import simkit.cli.main  # noqa: F401  (registers the commands)
from simkit.cli.common import app
from simkit.errors import SimkitError
from simkit.models import load_model
from simkit.models.loading import local_paths

NAME = "squeezenet1_1"  # the smallest torchvision model with pretrained weights: a fast prepared cache


def _hub_file(tmp_path, choice: str = "DEFAULT"):
    member = torchvision.models.get_model_weights(NAME)[choice]
    return tmp_path / "hub" / "checkpoints" / os.path.basename(urlparse(member.url).path), member


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A TORCH_HOME whose hub cache holds a state dict under the DEFAULT weights' file name; returns
    (file, the state dict saved there)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path, member = _hub_file(tmp_path)
    path.parent.mkdir(parents=True)
    source = torchvision.models.get_model(NAME, weights=None, num_classes=len(member.meta["categories"]))
    with torch.no_grad():
        for param in source.parameters():
            param.normal_(generator=torch.Generator().manual_seed(7))
    torch.save(source.state_dict(), path)
    return path, source.state_dict()


def test_default_weights_load_from_the_hub_cache(hub):
    path, saved = hub
    model = load_model(f"torchvision:{NAME}:weights=DEFAULT", seed=3)
    state = model.state_dict()
    assert state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)
    assert model.simkit_weights == f"pretrained (torchvision DEFAULT: {path.name})"
    assert not model.training
    assert local_paths(f"torchvision:{NAME}:weights=DEFAULT") == [path]  # recorded by digest in a run


def test_a_named_weights_member_reads_its_own_file(hub, tmp_path):
    path, _ = hub
    own, member = _hub_file(tmp_path, "IMAGENET1K_V1")
    assert own == path  # DEFAULT is an alias of IMAGENET1K_V1 here: the same file
    model = load_model(f"torchvision:{NAME}:weights=IMAGENET1K_V1")
    assert model.simkit_weights == f"pretrained (torchvision IMAGENET1K_V1: {path.name})"


def test_a_missing_file_names_the_path_to_place_and_the_url(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path, member = _hub_file(tmp_path)
    with pytest.raises(SimkitError) as caught:
        load_model(f"torchvision:{NAME}:weights=DEFAULT")
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and member.url in message
    assert "never downloads" in message and not path.exists()


def test_unknown_weights_and_a_file_that_does_not_fit(hub, tmp_path):
    with pytest.raises(SimkitError, match=r"unknown squeezenet1_1 weights 'IMAGENET9'.*DEFAULT"):
        load_model(f"torchvision:{NAME}:weights=IMAGENET9")
    path, _ = hub
    torch.save(torchvision.models.get_model("resnet18", weights=None).state_dict(), path)
    with pytest.raises(SimkitError, match=r"does not fit squeezenet1_1"):
        load_model(f"torchvision:{NAME}:weights=DEFAULT")


def test_a_file_that_holds_code_is_not_unpickled(hub):
    path, _ = hub
    path.write_bytes(b"not a torch file at all")
    with pytest.raises(SimkitError, match="is not a model file simkit can read"):
        load_model(f"torchvision:{NAME}:weights=DEFAULT")


def test_compare_report_and_summary_name_the_pretrained_weights(hub, tmp_path):
    path, _ = hub
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", f"torchvision:{NAME}:weights=DEFAULT", f"torchvision:{NAME}",
                                      "--data", "synthetic:3x32x32", "--n", "8", "--batch-size", "8",
                                      "--layers-a", "features.0", "--layers-b", "features.0",
                                      "--metric", "linear_cka", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["weights_a"] == f"pretrained (torchvision DEFAULT: {path.name})"
    assert summary["weights_b"].startswith("random init")
    assert f"pretrained (torchvision DEFAULT: {path.name})" in (out / "report.html").read_text()
