"""Layer pairing of a study (#26): ``last``/``first``, one name for all or one per cache, ``A=B`` names
across architectures (also with three or more caches), and ``depth[:F]`` by relative depth."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from simkit import SimkitError
from simkit.cli.main import app
from simkit.engine import capture, study
from simkit.engine.studies import depth_index, pairing_layers


def manifest(model: str, names: list[str]) -> dict:
    """A cache manifest as pairing reads it: the model and its cached layers in order."""
    return {"model": model, "layers": [{"name": name} for name in names]}


SHALLOW = manifest("r18", ["layer1.0", "layer2.0", "layer3.0", "layer4.0", "layer4.1"])
DEEP = manifest("r34", ["layer1.0", "layer2.0", "layer3.0", "layer3.1", "layer4.0", "layer4.1", "layer4.2"])
OTHER = manifest("vit", ["blocks.0", "blocks.1", "blocks.2"])


def test_alternative_names_work_with_three_caches():
    shallow_last = manifest("r18b", ["layer1.0", "layer4.1"])
    chosen = pairing_layers([shallow_last, manifest("r50", ["layer4.2"]), manifest("r50b", ["layer4.2"])],
                            "layer4.1=layer4.2")
    assert chosen == ["layer4.1", "layer4.2", "layer4.2"]
    assert pairing_layers([SHALLOW, OTHER, DEEP], "layer4.1 = blocks.2 = layer4.2") == \
        ["layer4.1", "blocks.2", "layer4.2"]  # DEEP holds layer4.1 and layer4.2: its own (third) name


def test_alternative_names_that_are_missing_or_ambiguous_are_one_line_errors():
    with pytest.raises(SimkitError, match=r"the cache of vit holds none of layer4\.1, layer4\.2; it holds: blocks\.0"):
        pairing_layers([SHALLOW, OTHER, DEEP], "layer4.1=layer4.2")
    with pytest.raises(SimkitError, match=r"the cache of r34 holds layer4\.1 and layer4\.2; give one name per cache"):
        pairing_layers([SHALLOW, DEEP, DEEP], "layer4.1=layer4.2")
    with pytest.raises(SimkitError, match="mixes forms"):
        pairing_layers([SHALLOW, DEEP, DEEP], "layer4.1=layer4.2,layer4.1")


def test_comma_names_first_and_last_are_unchanged():
    assert pairing_layers([SHALLOW, DEEP, OTHER], "last") == ["layer4.1", "layer4.2", "blocks.2"]
    assert pairing_layers([SHALLOW, DEEP, OTHER], "first") == ["layer1.0", "layer1.0", "blocks.0"]
    assert pairing_layers([SHALLOW, DEEP, OTHER], "layer2.0,layer3.1,blocks.1") == ["layer2.0", "layer3.1", "blocks.1"]
    assert pairing_layers([SHALLOW, DEEP], "layer2.0") == ["layer2.0", "layer2.0"]
    with pytest.raises(SimkitError, match="lists 2 layers for 3 caches"):
        pairing_layers([SHALLOW, DEEP, OTHER], "layer2.0,layer3.1")


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 17])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.6, 0.99, 1.0])
def test_depth_index_is_the_layer_nearest_the_relative_depth(count, fraction):
    index = depth_index(count, fraction)
    distances = [abs(i / max(count - 1, 1) - fraction) for i in range(count)]
    assert 0 <= index < count
    assert distances[index] == pytest.approx(min(distances))


def test_depth_pairs_each_architecture_by_its_own_relative_depth():
    assert pairing_layers([SHALLOW, DEEP, OTHER], "depth:0") == ["layer1.0", "layer1.0", "blocks.0"]
    assert pairing_layers([SHALLOW, DEEP, OTHER], "depth:1") == ["layer4.1", "layer4.2", "blocks.2"]
    # 5 layers: 0.5 → index 2; 7 layers: → index 3; 3 layers → index 1 (the middles)
    assert pairing_layers([SHALLOW, DEEP, OTHER], "depth") == ["layer3.0", "layer3.1", "blocks.1"]
    assert pairing_layers([SHALLOW, DEEP, OTHER], "depth:0.75") == ["layer4.0", "layer4.1", "blocks.2"]


@pytest.mark.parametrize("bad", ["depth:", "depth:x", "depth:1.5", "depth:-0.1", "depth:nan"])
def test_a_bad_relative_depth_is_refused(bad):
    if bad == "depth:":  # an empty fraction is the default middle
        assert pairing_layers([SHALLOW, OTHER], bad) == ["layer3.0", "blocks.1"]
        return
    with pytest.raises(SimkitError, match="is not a relative depth; give depth:F with F from 0"):
        pairing_layers([SHALLOW, OTHER], bad)


def net(widths: list[int], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for d_in, d_out in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(d_in, d_out), nn.Tanh()]
    return nn.Sequential(*layers)


@pytest.fixture
def caches(tmp_path):
    """Three caches of networks of different depth: their Tanh layers are cached, in order."""
    data = torch.randn(48, 5, generator=torch.Generator().manual_seed(0))
    paths = []
    for k, widths in enumerate(([5, 8, 6], [5, 7, 7, 6], [5, 9, 9, 9, 6])):
        model = net(widths, k)
        names = [str(i) for i in range(1, 2 * (len(widths) - 1), 2)]
        paths.append(capture(model, data, tmp_path / f"net{k}", layers=names, batch_size=16, progress=False,
                             model_name=f"net{k}", data_name="rand"))
    return paths


def test_a_study_by_depth_records_each_chosen_layer_and_its_depth(caches):
    result = study(caches, pairing="depth:0.5", metrics=["linear_cka"], batch_size=16, progress=False)
    models = result.tables["models"]
    assert list(models["layer"]) == ["3", "3", "5"]  # of 2 layers index 1, of 3 index 1, of 4 index 2
    assert list(models["depth"]) == pytest.approx([1.0, 0.5, 2 / 3])
    assert result.summary["pairing"] == "depth:0.5"
    named = study(caches, pairing="1=3=5", metrics=["linear_cka"], batch_size=16, progress=False)
    assert list(named.tables["models"]["layer"]) == ["1", "3", "5"]  # each holds several: one per cache


def test_the_cli_takes_alternative_names_and_depth_with_three_caches(caches, tmp_path):
    runner = CliRunner()
    for pairing in ("depth", "depth:1", "1=3=5"):
        out = tmp_path / f"study-{pairing.replace(':', '-').replace('=', '_')}"
        done = runner.invoke(app, ["compare", *map(str, caches), "--pairing", pairing, "--metric", "linear_cka",
                                   "--batch-size", "16", "--no-report", "--out", str(out)])
        assert done.exit_code == 0, done.output
        assert (out / "study.csv").is_file()
    bad = runner.invoke(app, ["compare", *map(str, caches), "--pairing", "depth:2", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2
    assert "--pairing 'depth:2' is not a relative depth" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "x").exists()
