"""Activation caches round-trip exactly; comparing caches equals comparing the models; studies."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from simkit import SimkitError
from simkit.cache import capture_to_cache, compare_caches, iter_cache, read_manifest
from simkit.comparison import compare
from simkit.study import run_study


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 9), nn.Tanh(), nn.Linear(9, 4), nn.Tanh())


@pytest.fixture
def data() -> torch.Tensor:
    return torch.randn(40, 5, generator=torch.Generator().manual_seed(1))


def capture(tmp_path, data, seed, batch_size=8, **kwargs):
    return capture_to_cache(model(seed), data, tmp_path / f"cache{seed}", layers=["1", "3"], batch_size=batch_size,
                            progress=False, model_name=f"m{seed}", data_name="rand", **kwargs)


def test_cache_round_trips_exactly(tmp_path, data):
    path = capture(tmp_path, data, 0, batch_size=7, shard_bytes=600)  # tiny shards: several files
    manifest = read_manifest(path)
    assert len(manifest["shards"]) > 1 and manifest["n"] == 40
    stored = {name: torch.cat([s[name] for s in iter_cache(path, ["1", "3"])]) for name in ("1", "3")}
    net = model(0)
    with torch.no_grad():  # the same batches of 7 as the capture: bit-identical
        assert torch.equal(stored["1"], torch.cat([net[:2](x) for x in data.split(7)]))
        assert torch.equal(stored["3"], torch.cat([net(x) for x in data.split(7)]))


@pytest.mark.parametrize("mode", ["minibatch", "exact"])
def test_compare_from_caches_equals_compare_from_models(tmp_path, data, mode):
    a, b = capture(tmp_path, data, 0), capture(tmp_path, data, 1)  # same batches as below: same activations
    cached = compare_caches(a, b, mode=mode, batch_size=8, progress=False)
    direct = compare(model(0), model(1), data, layers_a=["1", "3"], layers_b=["1", "3"], mode=mode,
                     batch_size=8, progress=False)
    np.testing.assert_allclose(cached.to_frame()["value"], direct.to_frame()["value"], rtol=0, atol=1e-12)


def test_caches_of_different_data_refused(tmp_path, data):
    a = capture(tmp_path, data, 0)
    b = capture_to_cache(model(1), data[:30], tmp_path / "short", layers=["1"], progress=False,
                         data_name="rand")
    with pytest.raises(SimkitError, match="caches hold different data"):
        compare_caches(a, b, progress=False)


def test_unknown_cached_layer_lists_valid_ones(tmp_path, data):
    a, b = capture(tmp_path, data, 0), capture(tmp_path, data, 1)
    with pytest.raises(SimkitError, match="unknown cached layer 'fc'"):
        compare_caches(a, b, layers_a="fc", progress=False)


def test_interrupted_capture_is_not_a_cache(tmp_path, data):
    path = capture(tmp_path, data, 0)
    (path / "manifest.json").unlink()
    with pytest.raises(SimkitError, match="not an activation cache"):
        read_manifest(path)


def test_study_matrix_matches_pairwise_compares(tmp_path, data):
    paths = [capture(tmp_path, data, seed) for seed in (0, 1, 2)]
    study = run_study(paths, pairing="last", metrics=["linear_cka"], batch_size=8, progress=False)
    matrix = study.matrix("linear_cka")
    assert matrix.shape == (3, 3)
    np.testing.assert_allclose(np.diag(matrix.to_numpy()), 1.0, atol=1e-12)
    pair = compare_caches(paths[0], paths[2], layers_a="3", layers_b="3", metrics=["linear_cka"], batch_size=8,
                          progress=False)
    assert matrix.loc["cache0", "cache2"] == pytest.approx(pair.matrix("linear_cka").iloc[0, 0], abs=1e-12)
    study.save(tmp_path / "study")
    assert json.loads((tmp_path / "study" / "result.json").read_text())["kind"] == "study"


@pytest.mark.parametrize("batch_size", [0, -3])
def test_bad_batch_size_is_a_clear_error_not_a_hang(tmp_path, data, batch_size):
    a, b = capture(tmp_path / "a", data, 0), capture(tmp_path / "b", data, 1)
    message = "--batch-size must be a positive integer"
    with pytest.raises(SimkitError, match=message):
        compare_caches(a, b, batch_size=batch_size, progress=False)
    with pytest.raises(SimkitError, match=message):
        run_study([a, b, a], batch_size=batch_size, progress=False)
    with pytest.raises(SimkitError, match=message):
        capture(tmp_path / "c", data, 0, batch_size=batch_size)
    assert not (tmp_path / "c").exists()


def test_cache_compares_and_studies_check_and_record_the_device(tmp_path, data):
    paths = [capture(tmp_path, data, seed) for seed in (0, 1, 2)]
    with pytest.raises(SimkitError, match="unknown device 'gpu'; use cpu, cuda or cuda:N"):
        compare_caches(paths[0], paths[1], device="gpu", progress=False)
    with pytest.raises(SimkitError, match="unknown device 'gpu'"):
        run_study(paths, device="gpu", progress=False)
    assert compare_caches(paths[0], paths[1], device="cpu", progress=False).meta["settings"]["device"] == "cpu"
    assert run_study(paths, device="cpu", progress=False).meta["settings"]["device"] == "cpu"
