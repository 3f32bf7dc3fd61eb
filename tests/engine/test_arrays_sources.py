"""What ``simkit.engine.arrays`` reads and how: every file format to the same layers, dict-likes of other
tools as they are (TransformerLens, nnsight, Hugging Face, anything with ``__array__``), files read in row
chunks, alignment by sample IDs (overlap, dropped counts, ``min_overlap``), studies mixing mappings, files
and caches, importing a file into a cache, and provenance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import simkit
from simkit.engine import capture, compare_caches
from simkit.engine.array_files import Chunked, InMemory
from simkit.engine.arrays import MEMORY, align, as_source, load_activations
from simkit.errors import SimkitError

pytestmark = pytest.mark.usefixtures("one_thread")

RNG = np.random.default_rng(0)
X = RNG.normal(size=(40, 5, 3)).astype(np.float32)  # (samples, tokens, features)
Y = RNG.normal(size=(40, 7)).astype(np.float32)


def test_every_format_reads_the_same_layers(tmp_path):
    import h5py

    np.save(tmp_path / "one.npy", Y)
    (tmp_path / "dir").mkdir()
    np.save(tmp_path / "dir" / "layer10.npy", Y)
    np.save(tmp_path / "dir" / "layer2.npy", X)
    np.savez_compressed(tmp_path / "a.npz", **{"blocks.2": X, "y": Y})
    save_file({"blocks.2": torch.tensor(X), "y": torch.tensor(Y)}, str(tmp_path / "a.safetensors"))
    torch.save({"blocks.2": torch.tensor(X), "y": torch.tensor(Y)}, tmp_path / "a.pt")
    with h5py.File(tmp_path / "a.h5", "w") as handle:
        handle.create_dataset("blocks/2", data=X)
        handle.create_dataset("y", data=Y)
    with load_activations(tmp_path / "one.npy") as source:
        assert list(source.layers) == ["one"] and isinstance(source.layers["one"], Chunked)  # read by row ranges
        np.testing.assert_array_equal(source.layers["one"].rows(slice(3, 9)).numpy(), Y[3:9])
        np.testing.assert_array_equal(source.layers["one"].rows(np.array([30, 2, 3, 4, 0])).numpy(), Y[[30, 2, 3, 4, 0]])
        np.testing.assert_array_equal(source.layers["one"].rows(slice(38, 45)).numpy(), Y[38:])
    np.save(tmp_path / "fortran.npy", np.asfortranarray(Y))
    with load_activations(tmp_path / "fortran.npy") as source:  # rows not contiguous: memory-mapped
        assert isinstance(source.layers["fortran"], InMemory) and isinstance(source.layers["fortran"].array, np.memmap)
        np.testing.assert_array_equal(source.layers["fortran"].rows(slice(3, 9)).numpy(), Y[3:9])
    with load_activations(tmp_path / "dir") as source:
        assert list(source.layers) == ["layer2", "layer10"]  # natural order, as layers are numbered
    for name in ("a.npz", "a.safetensors", "a.pt", "a.h5"):
        with load_activations(tmp_path / name) as source:
            assert sorted(source.layers) == ["blocks.2", "y"], name
            np.testing.assert_array_equal(source.layers["blocks.2"].rows(slice(3, 9)).numpy(), X[3:9])
            picked = np.array([30, 2, 3, 4, 17, 0])
            np.testing.assert_array_equal(source.layers["y"].rows(picked).numpy(), Y[picked])
            if name != "a.pt":
                assert isinstance(source.layers["y"], Chunked), name  # read in row chunks


def test_npz_members_are_read_in_row_chunks_forward(tmp_path):
    big = RNG.normal(size=(1000, 16)).astype(np.float32)
    np.savez(tmp_path / "big.npz", x=big)
    with load_activations(tmp_path / "big.npz") as source:
        layer = source.layers["x"]
        parts = [layer.rows(slice(start, start + 64)).numpy() for start in range(0, 1000, 64)]
        np.testing.assert_array_equal(np.concatenate(parts), big)
        np.testing.assert_array_equal(layer.rows(slice(10, 12)).numpy(), big[10:12])  # backwards: reopened


def test_tool_outputs_work_as_they_are():
    class ActivationCache:  # TransformerLens' cache: keys() and [], not a dict
        def __init__(self, values):
            self._values = values

        def keys(self):
            return self._values.keys()

        def __getitem__(self, key):
            return self._values[key]

    class Proxy:  # an older nnsight .save(): the tensor behind .value
        def __init__(self, value):
            self.value = value

    class Recording:  # anything with __array__
        def __array__(self, dtype=None, copy=None):
            return Y

    lens = ActivationCache({"blocks.0.hook_resid_post": torch.tensor(X), "blocks.1.hook_resid_post": torch.tensor(X)})
    nnsight = {"model.transformer.h.0.output": Proxy(torch.tensor(X)), "model.lm_head.output": torch.tensor(Y)}
    result = simkit.compare_arrays(lens, nnsight, metrics=["linear_cka"], mode="exact", progress=False,
                                   layers_a="blocks.*.hook_resid_post")
    assert result.matrix("linear_cka").shape == (2, 2)
    assert result.matrix("linear_cka").iloc[0, 0] == pytest.approx(1.0)  # the same tokens' mean
    assert list(result.tables["layers"]["reduction"]) == ["mean", "mean", "mean", "flatten"]
    brain = simkit.compare_arrays({"v1": Recording()}, {"y": Y}, metrics=["linear_cka"], progress=False)
    assert brain.matrix("linear_cka").iloc[0, 0] == pytest.approx(1.0)
    assert brain.summary["weights_a"] == MEMORY and brain.meta["sources"]["a"] == {"kind": "memory", "what": MEMORY}


def test_hugging_face_hidden_states_become_numbered_layers():
    states = tuple(torch.tensor(X) * (i + 1) for i in range(3))
    mask = torch.ones(40, 5, dtype=torch.long)
    mask[:, 3:] = 0
    layers = simkit.hf_hidden_states(states, attention_mask=mask)
    assert list(layers) == ["hidden_states.0", "hidden_states.1", "hidden_states.2", "attention_mask"]
    with as_source(layers, "acts", label="hf") as source:
        assert list(source.layers) == ["hidden_states.0", "hidden_states.1", "hidden_states.2"]
        assert source.mask is not None
    as_tuple = simkit.compare_arrays(states, {"first": torch.tensor(X[:, :3].mean(1))}, metrics=["linear_cka"],
                                     mode="exact", progress=False)
    masked = simkit.compare_arrays(layers, {"first": torch.tensor(X[:, :3].mean(1))}, metrics=["linear_cka"],
                                   mode="exact", progress=False)
    assert masked.matrix("linear_cka").iloc[0, 0] == pytest.approx(1.0)  # the mean over the 3 real tokens
    assert as_tuple.matrix("linear_cka").iloc[0, 0] < 0.99  # without the mask: over all 5
    with pytest.raises(SimkitError, match="output_hidden_states=True"):
        simkit.hf_hidden_states(object())


def test_ids_match_the_samples_present_on_both_sides():
    ids = [f"img{i:03d}" for i in range(40)]
    keep_b = RNG.permutation(40)[:37]  # B lacks 3 of A's samples, has 3 others, in another order
    b = {"y": np.concatenate([Y[keep_b], RNG.normal(size=(3, 7)).astype(np.float32)])}
    ids_b = [ids[i] for i in keep_b] + ["other1", "other2", "other3"]
    result = simkit.compare_arrays({"y": Y}, b, ids_a=ids, ids_b=ids_b, metrics=["linear_cka"], mode="exact",
                                   progress=False)
    assert result.summary["samples"] == {"aligned_by": "ids", "matched": 37, "rows_a": 40, "rows_b": 40,
                                         "dropped_a": 3, "dropped_b": 3}
    assert result.summary["n"] == 37
    assert result.matrix("linear_cka").iloc[0, 0] == pytest.approx(1.0)
    with pytest.raises(SimkitError, match="only 37 sample IDs.*`min_overlap` 0.95"):
        simkit.compare_arrays({"y": Y}, b, ids_a=ids, ids_b=ids_b, min_overlap=0.95, progress=False)
    with pytest.raises(SimkitError, match="no sample ID is shared"):
        simkit.compare_arrays({"y": Y}, b, ids_a=ids, ids_b=[f"x{i}" for i in range(40)], progress=False)
    with pytest.raises(SimkitError, match="name sample 'img001' twice"):
        simkit.compare_arrays({"y": Y}, b, ids_a=["img001"] * 40, ids_b=ids, progress=False)
    with pytest.raises(SimkitError, match="different numbers of samples.*give IDs"):
        simkit.compare_arrays({"y": Y}, {"y": Y[:30]}, progress=False)


def test_ids_from_a_file_and_a_csv_column(tmp_path):
    ids = [f"s{i}" for i in range(40)]
    (tmp_path / "ids.txt").write_text("\n".join(ids) + "\n")
    (tmp_path / "ids.csv").write_text("index,stimulus\n" + "".join(f"{i},{s}\n" for i, s in enumerate(reversed(ids))))
    with load_activations(_npz(tmp_path, "a", y=Y), ids=tmp_path / "ids.txt") as a, \
            load_activations(_npz(tmp_path, "b", y=Y[::-1]), ids=tmp_path / "ids.csv", ids_column="stimulus") as b:
        alignment = align([a, b], 0.9)
        assert alignment.by == "ids" and alignment.matched == 40
        np.testing.assert_array_equal(alignment.index[1], np.arange(39, -1, -1))
    with pytest.raises(SimkitError, match="no column 'id'.*'index', 'stimulus'"):
        load_activations(_npz(tmp_path, "c", y=Y), ids=tmp_path / "ids.csv", ids_column="id")


def _npz(folder, name, **arrays):
    path = folder / f"{name}.npz"
    np.savez(path, **arrays)
    return path


def test_a_study_mixes_mappings_files_and_caches(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh())
    data = torch.tensor(Y)
    cache = capture(model, data, tmp_path / "cache", layers=["1"], batch_size=16, progress=False)
    with torch.no_grad():
        hidden = model(data).numpy()
    result = simkit.study([cache, _npz(tmp_path, "file", h=hidden), {"y": Y, "t": X}], metrics=["linear_cka"],
                          mode="exact", pairing="last", progress=False)
    matrix = result.matrix("linear_cka").to_numpy()
    assert matrix.shape == (3, 3)
    assert matrix[0, 1] == pytest.approx(1.0)  # the cache and the file hold the same activations
    assert result.summary["samples"]["aligned_by"] == "position"
    assert result.tables["models"]["cache"].tolist()[2] == MEMORY
    assert result.tables["models"]["layer"].tolist() == ["1", "h", "t"]
    assert result.meta["sources"]["file.npz"]["sha256"]


def test_importing_a_file_into_a_cache_keeps_layers_and_ids(tmp_path):
    ids = [str(i) for i in range(40)]
    order = RNG.permutation(40)
    a = _npz(tmp_path, "a", t=X, y=Y, ids=np.array(ids))
    b = _npz(tmp_path, "b", y=Y[order], ids=np.array(ids)[order])
    cache_a = simkit.capture_arrays(a, tmp_path / "ca", progress=False, batch_size=16)
    cache_b = simkit.capture_arrays(b, tmp_path / "cb", progress=False)
    manifest = json.loads((cache_a / "manifest.json").read_text())
    assert manifest["source"] == "arrays" and manifest["ids"] == "ids.json"
    assert [layer["name"] for layer in manifest["layers"]] == ["t", "y"]
    assert [layer["reduction"] for layer in manifest["layers"]] == ["mean", "flatten"]
    from_caches = compare_caches(cache_a, cache_b, metrics=["linear_cka"], mode="exact", progress=False)
    from_files = simkit.compare_arrays(a, b, metrics=["linear_cka"], mode="exact", progress=False)
    np.testing.assert_allclose(from_caches.tables["similarity"]["value"], from_files.tables["similarity"]["value"],
                               rtol=0, atol=1e-10)
    assert from_caches.summary["samples"]["aligned_by"] == "ids"


def test_files_are_named_by_path_and_sha256(tmp_path):
    from simkit.rundir import sha256

    a = _npz(tmp_path, "a", y=Y)
    result = simkit.compare_arrays(a, {"y": Y}, metrics=["linear_cka"], progress=False)
    assert result.summary["model_a"] == str(a) and result.summary["model_b"] == "arrays B"
    assert sha256(a) in result.summary["weights_a"]
    assert result.meta["sources"]["a"] == {"kind": "file", "path": str(a), "format": "npz", "sha256": sha256(a)}


def test_a_loaded_source_is_not_closed_by_a_comparison(tmp_path):
    with load_activations(_npz(tmp_path, "a", y=Y)) as source:
        first = simkit.compare_arrays(source, {"y": Y}, metrics=["linear_cka"], progress=False)
        again = simkit.compare_arrays(source, {"y": Y}, metrics=["linear_cka"], progress=False)
    assert first.matrix("linear_cka").equals(again.matrix("linear_cka"))


def test_caches_captured_from_models_keep_their_sample_check(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(7, 6), torch.nn.Tanh())
    data = torch.tensor(Y)
    first = capture(model, data, tmp_path / "first", layers=["1"], progress=False)
    other = capture(model, data.flip(0), tmp_path / "other", layers=["1"], progress=False)
    with pytest.raises(SimkitError, match="caches hold different samples"):
        simkit.compare_arrays(first, other, progress=False)
    with pytest.raises(SimkitError, match="caches hold different samples"):
        simkit.study([first, other, {"y": Y}], progress=False)
    assert simkit.compare_arrays(first, {"y": Y}, progress=False).summary["samples"]["aligned_by"] == "position"
