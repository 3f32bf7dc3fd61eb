"""Activation caches round-trip exactly; comparing caches equals comparing the models; studies."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from simkit import SimkitError
from simkit.engine import capture, compare, compare_caches, iter_cache, read_manifest, study


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 9), nn.Tanh(), nn.Linear(9, 4), nn.Tanh())


@pytest.fixture
def data() -> torch.Tensor:
    return torch.randn(40, 5, generator=torch.Generator().manual_seed(1))


def write_cache(tmp_path, data, seed, batch_size=8, **kwargs):
    return capture(model(seed), data, tmp_path / f"cache{seed}", layers=["1", "3"], batch_size=batch_size,
                            progress=False, model_name=f"m{seed}", data_name="rand", **kwargs)


def test_cache_round_trips_exactly(tmp_path, data):
    path = write_cache(tmp_path, data, 0, batch_size=7, shard_bytes=600)  # tiny shards: several files
    manifest = read_manifest(path)
    assert len(manifest["shards"]) > 1 and manifest["n"] == 40
    stored = {name: torch.cat([s[name] for s in iter_cache(path, ["1", "3"])]) for name in ("1", "3")}
    net = model(0)
    with torch.no_grad():  # the same batches of 7 as the capture: bit-identical
        assert torch.equal(stored["1"], torch.cat([net[:2](x) for x in data.split(7)]))
        assert torch.equal(stored["3"], torch.cat([net(x) for x in data.split(7)]))


@pytest.mark.parametrize("mode", ["minibatch", "exact"])
def test_compare_from_caches_equals_compare_from_models(tmp_path, data, mode):
    a, b = write_cache(tmp_path, data, 0), write_cache(tmp_path, data, 1)  # same batches as below: same activations
    cached = compare_caches(a, b, mode=mode, batch_size=8, progress=False)
    direct = compare(model(0), model(1), data, layers_a=["1", "3"], layers_b=["1", "3"], mode=mode,
                     batch_size=8, progress=False)
    np.testing.assert_allclose(cached.to_frame()["value"], direct.to_frame()["value"], rtol=0, atol=1e-12)


def test_caches_of_different_data_refused(tmp_path, data):
    a = write_cache(tmp_path, data, 0)
    b = capture(model(1), data[:30], tmp_path / "short", layers=["1"], progress=False,
                         data_name="rand")
    with pytest.raises(SimkitError, match="caches hold different data"):
        compare_caches(a, b, progress=False)


def test_unknown_cached_layer_lists_valid_ones(tmp_path, data):
    a, b = write_cache(tmp_path, data, 0), write_cache(tmp_path, data, 1)
    with pytest.raises(SimkitError, match="unknown cached layer 'fc'"):
        compare_caches(a, b, layers_a="fc", progress=False)


def test_interrupted_capture_is_not_a_cache(tmp_path, data):
    path = write_cache(tmp_path, data, 0)
    (path / "manifest.json").unlink()
    with pytest.raises(SimkitError, match="not an activation cache"):
        read_manifest(path)


def test_study_matrix_matches_pairwise_compares(tmp_path, data):
    paths = [write_cache(tmp_path, data, seed) for seed in (0, 1, 2)]
    result = study(paths, pairing="last", metrics=["linear_cka"], batch_size=8, progress=False)
    matrix = result.matrix("linear_cka")
    assert matrix.shape == (3, 3)
    np.testing.assert_allclose(np.diag(matrix.to_numpy()), 1.0, atol=1e-12)
    pair = compare_caches(paths[0], paths[2], layers_a="3", layers_b="3", metrics=["linear_cka"], batch_size=8,
                          progress=False)
    assert matrix.loc["cache0", "cache2"] == pytest.approx(pair.matrix("linear_cka").iloc[0, 0], abs=1e-12)
    result.save(tmp_path / "study")
    assert json.loads((tmp_path / "study" / "result.json").read_text())["kind"] == "study"


@pytest.mark.parametrize("batch_size", [0, -3])
def test_bad_batch_size_is_a_clear_error_not_a_hang(tmp_path, data, batch_size):
    a, b = write_cache(tmp_path / "a", data, 0), write_cache(tmp_path / "b", data, 1)
    message = "`batch_size` must be a positive integer"
    with pytest.raises(SimkitError, match=message):
        compare_caches(a, b, batch_size=batch_size, progress=False)
    with pytest.raises(SimkitError, match=message):
        study([a, b, a], batch_size=batch_size, progress=False)
    with pytest.raises(SimkitError, match=message):
        write_cache(tmp_path / "c", data, 0, batch_size=batch_size)
    assert not (tmp_path / "c").exists()


def test_cache_compares_and_studies_check_and_record_the_device(tmp_path, data):
    paths = [write_cache(tmp_path, data, seed) for seed in (0, 1, 2)]
    with pytest.raises(SimkitError, match="unknown device 'gpu'; use cpu, cuda or cuda:N"):
        compare_caches(paths[0], paths[1], device="gpu", progress=False)
    with pytest.raises(SimkitError, match="unknown device 'gpu'"):
        study(paths, device="gpu", progress=False)
    assert compare_caches(paths[0], paths[1], device="cpu", progress=False).meta["settings"]["device"] == "cpu"
    assert study(paths, device="cpu", progress=False).meta["settings"]["device"] == "cpu"


def test_compare_caches_and_studies_record_the_same_provenance_as_compare(tmp_path, data):
    paths = [write_cache(tmp_path, data, seed) for seed in (0, 1, 2)]
    options = dict(metrics=["linear_cka"], mode="exact", batch_size=8, n=32, null=0, seed=4, rbf_factor=2.0,
                   knn_k=3, memory_budget_bytes=10**6, progress=False)
    direct = compare(model(0), model(1), data, layers_a=["1", "3"], layers_b=["1", "3"], **options)
    pair = compare_caches(paths[0], paths[1], **options)
    many = study(paths, **options)
    shared = {key: direct.meta["settings"][key] for key in (
        "metrics", "mode", "batch_size", "n", "null", "seed", "rbf_factor", "knn_k", "memory_budget_bytes",
        "device")}
    for result in (pair, many):
        assert {key: result.meta["settings"][key] for key in shared} == shared
        assert result.meta["seeds"]["null"] == 4 and result.meta["world_size"] == 1
        assert result.meta["method"]["linear_cka"]["mode"] == "exact"
        assert result.summary["n"] == 32
    assert pair.meta["seeds"] == {"null": 4, "model_a": 0, "model_b": 0}
    assert pair.meta["settings"]["layers_a"] == "blocks" and many.meta["settings"]["pairing"] == "last"
    np.testing.assert_allclose(pair.to_frame()["value"], direct.to_frame()["value"], rtol=0, atol=1e-12)


def test_a_data_spec_string_is_refused(tmp_path):
    with pytest.raises(SimkitError, match="load_data"):
        capture(model(0), "mnist1d", tmp_path / "c", progress=False)
    assert not (tmp_path / "c").exists()
