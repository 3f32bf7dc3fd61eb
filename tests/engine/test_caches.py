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


def test_manifest_records_the_digest_of_the_samples(tmp_path, data):
    import hashlib

    manifest = read_manifest(write_cache(tmp_path, data, 0, batch_size=7))
    expected = hashlib.sha256(str([(torch.float32, (5,))]).encode())  # dtype and sample shape, then the bytes
    expected.update(data.numpy().tobytes())
    assert manifest["samples_sha256"] == expected.hexdigest() and manifest["samples_digest_of"] == "inputs"
    other_batches = read_manifest(write_cache(tmp_path / "b", data, 0, batch_size=9))
    assert other_batches["samples_sha256"] == manifest["samples_sha256"]  # the samples, not their batching


def test_caches_of_changed_or_reordered_samples_refused(tmp_path, data):
    a = write_cache(tmp_path, data, 0)
    changed = data.clone()
    changed[17, 2] += 1e-3  # the same spec string and n, one value changed (a file rewritten meanwhile)
    b = capture(model(1), changed, tmp_path / "changed", layers=["1", "3"], batch_size=8, progress=False,
                data_name="rand")
    with pytest.raises(SimkitError, match=r"caches hold different samples although both read 'rand' \(n = 40\)"):
        compare_caches(a, b, progress=False)
    c = capture(model(1), data.flip(0), tmp_path / "reordered", layers=["1", "3"], batch_size=8, progress=False,
                data_name="rand")
    with pytest.raises(SimkitError, match="came in another order"):
        study([a, b, c], progress=False)
    same = capture(model(1), data.clone(), tmp_path / "same", layers=["1", "3"], batch_size=8, progress=False,
                   data_name="rand")
    compare_caches(a, same, progress=False)  # equal content: accepted


def test_cache_without_a_digest_is_compared_with_a_warning(tmp_path, data):
    a, b = write_cache(tmp_path, data, 0), write_cache(tmp_path, data, 1)
    manifest = json.loads((b / "manifest.json").read_text())
    del manifest["samples_sha256"]
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(RuntimeWarning, match="records no digest of its samples"):
        compare_caches(a, b, progress=False)


def test_text_caches_are_digested_by_their_lines(tmp_path):
    from simkit.data import load_data
    from simkit.engine.caches import SampleDigest

    (tmp_path / "t.txt").write_text("one line\nanother, longer line\nthird\n")
    data = load_data(f"text:{tmp_path / 't.txt'}", tokenizer="bytes")
    digest = SampleDigest(data)
    digest.add(data.inputs)  # ignored: the texts, not their tokens, are the samples
    digest.add(data.inputs)
    expected = hashlib_of(["one line", "another, longer line", "third"][:2])
    assert digest.result(2) == (expected, "texts")
    assert data.take(torch.tensor([2, 0])).info["texts_sha256"] == [data.info["texts_sha256"][i] for i in (2, 0)]


def hashlib_of(lines: list[str]) -> str:
    import hashlib

    outer = hashlib.sha256()
    for line in lines:
        outer.update(hashlib.sha256(line.encode()).digest())
    return outer.hexdigest()


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


class _Table(torch.nn.Module):
    """A "model" whose one layer outputs a fixed random table's rows for the sample indices asked for."""

    def __init__(self, seed: int, n: int = 256, width: int = 6):
        super().__init__()
        self.layer = torch.nn.Identity()
        self.register_buffer("table", torch.randn(n, width, generator=torch.Generator().manual_seed(seed)))

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.layer(self.table[index])


def test_a_study_of_unrelated_models_names_no_similar_pair(tmp_path):
    """#26: no "most similar pair" from noise, self-pairs never counted, values readable when marked."""
    from simkit.engine import capture, study
    from simkit.report import study as study_report

    index = torch.arange(256)
    paths = [capture(_Table(seed), index, tmp_path / f"m{seed}", layers=["layer"], model_name=f"noise{seed}",
                     data_name="index", progress=False) for seed in range(3)]
    result = study(paths, metrics=["unbiased_cka"], mode="exact", progress=False)
    found = study_report.context(result)["findings"]
    assert "no pair of different models beats chance" in found[0] and "most similar pair is" not in found[0]
    assert any(line.startswith("unbiased_cka: 0 of 6 pairs beat chance") for line in found), found
