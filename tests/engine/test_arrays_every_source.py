"""Activations as the engine's third source (``simkit.engine.arrays``): the same activations give the same
values through every source — a model pair, its two caches, the arrays captured in memory and the same
arrays written to ``.npy`` files, ``.npz``, ``.safetensors``, ``.h5`` and ``.pt`` — for every measure of
the catalogue in both modes, chance levels included; a row-shuffled copy matched by sample IDs gives the
same values too."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import simkit
from simkit.catalog import METRICS
from simkit.engine import capture, compare_caches
from simkit.layers import record_layers

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = ["1", "3"]
BATCH = 32
N = 96
MODES = ("exact", "minibatch")


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 6), nn.GELU(), nn.Linear(6, 3)).eval()


def in_memory(model: nn.Module, data: torch.Tensor) -> dict[str, torch.Tensor]:
    """The chosen layers' activations recorded batch by batch, as the engine's taps record them."""
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in LAYERS}
    with record_layers(model, LAYERS) as recorder:
        for start in range(0, len(data), BATCH):
            model(data[start:start + BATCH])
            for name, value in recorder.pop().items():
                parts[name].append(value)
    return {name: torch.cat(values) for name, values in parts.items()}


def write_files(acts: dict[str, torch.Tensor], folder, ids: list[int] | None = None) -> dict[str, str]:
    """The same arrays as a directory of .npy files, .npz, .safetensors, .h5 and .pt (with an ``ids`` entry
    when given: whole numbers, which safetensors can hold)."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    arrays = {name: value.numpy() for name, value in acts.items()}
    extra = {} if ids is None else {"ids": np.array(ids)}
    (folder / "npy").mkdir(exist_ok=True)
    for name, array in {**arrays, **extra}.items():
        np.save(folder / "npy" / f"{name}.npy", array)
    np.savez(folder / "acts.npz", **arrays, **extra)
    save_file({**{name: value.contiguous() for name, value in acts.items()},
               **({} if ids is None else {"ids": torch.tensor(ids)})}, str(folder / "acts.safetensors"))
    with h5py.File(folder / "acts.h5", "w") as handle:
        for name, array in {**arrays, **extra}.items():
            handle.create_dataset(name, data=array)
    torch.save({**acts, **({} if ids is None else {"ids": ids})}, folder / "acts.pt")
    return {kind: str(folder / name) for kind, name in
            (("npy", "npy"), ("npz", "acts.npz"), ("safetensors", "acts.safetensors"), ("h5", "acts.h5"),
             ("pt", "acts.pt"))}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sources")
    data = torch.randn(N, 12, generator=torch.Generator().manual_seed(0))
    models = mlp(0), mlp(1)
    caches = [capture(model, data, folder / f"cache{i}", layers=LAYERS, batch_size=BATCH, progress=False)
              for i, model in enumerate(models)]
    acts = [in_memory(model, data) for model in models]
    files = [write_files(a, folder / f"files{i}") for i, a in enumerate(acts)]
    return {"models": models, "data": data, "caches": caches, "acts": acts, "files": files, "folder": folder}


def values(result) -> pd.DataFrame:
    frame = result.tables["similarity"]
    return frame.drop(columns=["layer_a", "layer_b", "metric"]).astype(float)


def assert_same(result, reference) -> None:
    got, want = values(result), values(reference)
    assert list(got.columns) == list(want.columns)
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=0, atol=1e-10, equal_nan=True)
    assert list(result.tables["similarity"]["layer_a"]) == list(reference.tables["similarity"]["layer_a"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("metric", METRICS)
def test_every_source_gives_the_same_values(sources, metric, mode):
    settings = simkit.CompareSettings(metrics=[metric], mode=mode, batch_size=BATCH)
    reference = simkit.compare(*sources["models"], sources["data"], settings, layers_a=LAYERS, layers_b=LAYERS,
                               progress=False)
    assert np.isfinite(values(reference)["value"]).all()
    assert_same(compare_caches(*sources["caches"], settings, progress=False), reference)
    assert_same(simkit.compare_arrays(*sources["acts"], settings, progress=False), reference)
    for kind in sources["files"][0]:
        result = simkit.compare_arrays(sources["files"][0][kind], sources["files"][1][kind], settings, progress=False)
        assert_same(result, reference)
        assert result.summary["samples"]["aligned_by"] == "position"


@pytest.fixture(scope="module")
def shuffled(sources):
    """B's activations with its rows shuffled, each row carrying its sample ID; A in order with IDs."""
    ids = [1000 + 7 * i for i in range(N)]
    order = np.random.default_rng(1).permutation(N)
    acts_b = {name: value[torch.as_tensor(order)] for name, value in sources["acts"][1].items()}
    folder = sources["folder"]
    return (write_files(sources["acts"][0], folder / "ids_a", ids),
            write_files(acts_b, folder / "ids_b", [ids[i] for i in order]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("metric", METRICS)
def test_shuffled_rows_matched_by_ids_give_the_same_values(sources, shuffled, metric, mode):
    settings = simkit.CompareSettings(metrics=[metric], mode=mode, batch_size=BATCH)
    reference = simkit.compare_arrays(*sources["acts"], settings, progress=False)
    for kind in ("npz", "h5") if metric != "linear_cka" else shuffled[0]:  # every format once
        result = simkit.compare_arrays(shuffled[0][kind], shuffled[1][kind], settings, progress=False)
        assert_same(result, reference)
        assert result.summary["samples"] == {"aligned_by": "ids", "matched": N, "rows_a": N, "rows_b": N,
                                             "dropped_a": 0, "dropped_b": 0}


def test_shuffled_rows_without_ids_differ(sources, shuffled):
    """The check above can fail: the same shuffled rows aligned by position give other values."""
    settings = simkit.CompareSettings(metrics=["linear_cka"], mode="exact", batch_size=BATCH)
    reference = simkit.compare_arrays(*sources["acts"], settings, progress=False)
    stripped = {name: np.load(shuffled[1]["npz"])[name] for name in LAYERS}
    result = simkit.compare_arrays(sources["acts"][0], stripped, settings, progress=False)
    assert np.abs(values(result)["value"] - values(reference)["value"]).max() > 0.01


@pytest.mark.parametrize(("metric", "mode"), [("unbiased_cka", "minibatch"), ("linear_cka", "exact"), ("cca", "exact")])
def test_intervals_and_nulls_are_the_same_from_files(sources, metric, mode):
    settings = simkit.CompareSettings(metrics=[metric], mode=mode, batch_size=BATCH, null=12, ci=0.9, ci_resamples=20)
    reference = simkit.compare(*sources["models"], sources["data"], settings, layers_a=LAYERS, layers_b=LAYERS,
                               progress=False)
    assert {"ci_low", "ci_high", "null_mean", "chance"} <= set(values(reference).columns)
    assert_same(simkit.compare_arrays(sources["files"][0]["npz"], sources["files"][1]["npz"], settings,
                                      progress=False), reference)
