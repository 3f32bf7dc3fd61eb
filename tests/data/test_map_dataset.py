"""Map-style datasets (``TensorDataset``, any ``__getitem__`` + ``__len__``) wherever data is (issue #26)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Subset, TensorDataset

from simkit.engine import capture, compare
from simkit.engine.batches import count_rows, global_batches
from simkit.errors import SimkitError


class Samples:
    """A plain map-style dataset: no torch base class, items are (x, label) pairs."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def __getitem__(self, index: int):
        return self.x[index], index % 3

    def __len__(self) -> int:
        return len(self.x)


class Tokens:
    """A map-style dataset whose items are dicts of tensors (one tokenised sample each)."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __getitem__(self, index: int):
        return {"input_ids": self.ids[index], "attention_mask": torch.ones_like(self.ids[index])}

    def __len__(self) -> int:
        return len(self.ids)


def _models():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    b = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 3))
    return a, b


def _batches(data, batch_size=7, n=None):
    return [(i, batch) for i, batch in global_batches(data, batch_size, n)]


@pytest.mark.parametrize("wrap", [lambda x: TensorDataset(x, torch.arange(len(x))), lambda x: TensorDataset(x),
                                  Samples, lambda x: Subset(TensorDataset(x), range(len(x))), lambda x: x.numpy()])
def test_map_style_batches_are_the_tensors_batches(wrap):
    x = torch.randn(30, 8)
    got, want = _batches(wrap(x)), _batches(x)
    assert [i for i, _ in got] == [i for i, _ in want] == [0, 1, 2, 3, 4]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert torch.equal(torch.as_tensor(a), b)
    assert count_rows(wrap(x)) == 30
    capped = _batches(wrap(x), n=10)
    assert sum(len(b) for _, b in capped) == 10 and torch.equal(torch.cat([b for _, b in capped]), x[:10])


def test_a_numpy_array_of_float64_rows_reads_as_float32():
    x = np.random.default_rng(0).standard_normal((5, 3))
    (_, batch), = _batches(x, batch_size=8)
    assert batch.dtype == torch.float32 and np.allclose(batch.numpy(), x, atol=1e-6)


def test_map_style_dict_items_stack_per_key():
    ids = torch.randint(0, 50, (9, 5))
    batches = _batches(Tokens(ids), batch_size=4)
    assert [b["input_ids"].shape[0] for _, b in batches] == [4, 4, 1]
    assert torch.equal(torch.cat([b["input_ids"] for _, b in batches]), ids)


def test_compare_accepts_a_tensor_dataset_and_agrees_with_the_tensor():
    a, b = _models()
    x = torch.randn(64, 8)
    kwargs = dict(layers_a="0,2", layers_b="0,2", progress=False, metrics=["linear_cka"], mode="exact")
    mapped = compare(a, b, TensorDataset(x, torch.zeros(64)), **kwargs)
    plain = compare(a, b, x, **kwargs)
    assert np.allclose(mapped.matrix("linear_cka"), plain.matrix("linear_cka"), atol=1e-6)
    assert mapped.summary["n"] == 64 and mapped.summary["data"] == "TensorDataset"


def test_capture_accepts_a_map_style_dataset(tmp_path):
    a, _ = _models()
    x = torch.randn(20, 8)
    from_map = capture(a, Samples(x), tmp_path / "map", layers="0", batch_size=6, progress=False)
    from_tensor = capture(a, x, tmp_path / "tensor", layers="0", batch_size=6, progress=False)
    manifests = [json.loads((p / "manifest.json").read_text()) for p in (from_map, from_tensor)]
    assert manifests[0]["n"] == 20 and manifests[0]["samples_sha256"] == manifests[1]["samples_sha256"]


def test_a_map_style_item_that_is_not_numbers_is_one_line():
    class Words(Samples):
        def __getitem__(self, index):
            return "word", 0

    with pytest.raises(SimkitError, match=r"item 0 of the data holds a str; a map-style dataset's items must be"):
        _batches(Words(torch.zeros(3, 2)))


def test_an_object_that_is_neither_is_still_refused():
    with pytest.raises(SimkitError, match=r"data of type object is not iterable; pass a Tensor, a Dataset "
                                          r"\(map-style: __getitem__ and __len__\) or a DataLoader"):
        _batches(object())
