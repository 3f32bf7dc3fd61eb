"""Data specs → Dataset: the built-in sources, files, splits, batching and the errors users see."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit.data import Dataset, load_data, parse_spec
from simkit.errors import SimkitError


def test_parse_spec_options():
    assert parse_spec("npy:/a/x.npy,labels=/a/y.npy") == ("npy", "/a/x.npy", {"labels": "/a/y.npy"})
    assert parse_spec("mnist1d") == ("mnist1d", "", {})
    with pytest.raises(SimkitError, match="option 'oops' is not key=value"):
        parse_spec("npy:x.npy,oops")


def test_mnist1d_shapes_split_and_rng_untouched():
    random.seed(5)
    np.random.seed(5)
    before = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    data = load_data("mnist1d")
    assert (random.random(), np.random.rand()) == before  # generation does not reseed the caller
    assert data.inputs.shape == (4000, 1, 40) and data.inputs.dtype == torch.float32
    assert data.labels.shape == (4000,) and data.labels.dtype == torch.int64
    assert data.test is not None and data.test.inputs.shape == (1000, 1, 40)
    assert data.info["num_classes"] == 10 and data.info["input_shape"] == (1, 40)
    assert set(data.labels.tolist()) == set(range(10))
    # the same arrays as mnist1d's own generator with its default arguments
    from mnist1d.data import make_dataset

    raw = make_dataset()
    np.testing.assert_array_equal(data.inputs[:, 0].numpy(), raw["x"].astype(np.float32))
    np.testing.assert_array_equal(data.test.labels.numpy(), raw["y_test"])
    capped = load_data("mnist1d", n=100)
    assert len(capped) == 100 and len(capped.test) == 1000
    assert torch.equal(capped.inputs, data.inputs[:100])


def test_mnist1d_cache_written_once_and_reused(tmp_path, monkeypatch):
    import mnist1d.data

    import simkit.data as data_module

    calls = []

    def fake_make_dataset():
        calls.append(1)
        rng = np.random.default_rng(len(calls))
        return {"x": rng.normal(size=(8, 40)), "y": np.arange(8) % 10, "x_test": rng.normal(size=(2, 40)),
                "y_test": np.arange(2), "t": None}

    monkeypatch.setenv("SIMKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(mnist1d.data, "make_dataset", fake_make_dataset)
    data_module._mnist1d_arrays.cache_clear()
    try:
        first = load_data("mnist1d")
        assert len(list(tmp_path.glob("mnist1d-*.npz"))) == 1 and not list(tmp_path.glob(".*tmp"))
        data_module._mnist1d_arrays.cache_clear()
        second = load_data("mnist1d")
    finally:
        data_module._mnist1d_arrays.cache_clear()
    assert calls == [1] and torch.equal(first.inputs, second.inputs) and len(second.test) == 2


def test_digits_stratified_fixed_split():
    data = load_data("digits")
    assert data.inputs.shape[1:] == (1, 8, 8) and data.inputs.dtype == torch.float32
    assert len(data) + len(data.test) == 1797 and len(data.test) == 360
    assert float(data.inputs.min()) == 0.0 and float(data.inputs.max()) == 1.0
    train_counts = np.bincount(data.labels.numpy(), minlength=10) / len(data)
    test_counts = np.bincount(data.test.labels.numpy(), minlength=10) / len(data.test)
    assert np.abs(train_counts - test_counts).max() < 0.01  # stratified
    again = load_data("digits", seed=7)  # the split is part of the dataset's definition
    assert torch.equal(again.inputs, data.inputs)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # every train image is one of sklearn's images, scaled by 1/16
    row = data.inputs[0].reshape(-1).numpy()
    assert np.any(np.all(np.isclose(bunch.data / 16.0, row), axis=1))


def test_synthetic_seeded_lazy_and_batch_size_independent():
    a = load_data("synthetic:3x4x4", n=10, seed=1)
    b = load_data("synthetic:3x4x4", n=10, seed=1)
    c = load_data("synthetic:3x4x4", n=10, seed=2)
    assert a.labels is None and a.info["input_shape"] == (3, 4, 4) and a.is_lazy
    assert torch.equal(a.rows(2, 5), b.take(slice(2, 5)).inputs) and a.is_lazy  # streaming keeps it lazy
    full = a.inputs
    assert not a.is_lazy
    assert full.shape == (10, 3, 4, 4)
    assert torch.equal(full, b.inputs) and not torch.equal(full, c.inputs)
    for size in (1, 3, 10, 64):
        assert torch.equal(torch.cat(list(b.batches(size))), full)
    assert torch.equal(a.take(torch.tensor([7, 2])).inputs, full[[7, 2]])
    window = load_data("synthetic:3x4x4", n=10, seed=1).take(slice(3, 8))
    assert window.is_lazy and len(window) == 5 and torch.equal(window.rows(1, 3), full[4:6])
    assert torch.equal(window.inputs, full[3:8])
    assert torch.equal(load_data("synthetic:3x4x4", n=4, seed=1).inputs, full[:4])  # prefix-stable
    assert len(load_data("synthetic:8")) == 1024
    assert abs(float(load_data("synthetic:1000", n=4).inputs.std()) - 1.0) < 0.05


def test_npy_and_pt_files(tmp_path):
    x = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float64)
    y = np.arange(12) % 3
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    data = load_data(f"npy:{tmp_path}/x.npy,labels={tmp_path}/y.npy", n=8)
    assert data.inputs.dtype == torch.float32 and data.inputs.shape == (8, 5)
    np.testing.assert_allclose(data.inputs.numpy(), x[:8].astype(np.float32))
    assert data.labels.tolist() == y[:8].tolist() and data.info["num_classes"] == 3
    torch.save({"inputs": torch.ones(6, 2), "labels": torch.arange(6)}, tmp_path / "d.pt")
    pt = load_data(f"pt:{tmp_path}/d.pt")
    assert pt.inputs.shape == (6, 2) and pt.labels.tolist() == list(range(6))
    torch.save((torch.zeros(4, 3), torch.tensor([0, 1, 0, 1])), tmp_path / "pair.pt")
    assert load_data(f"pt:{tmp_path}/pair.pt").labels.tolist() == [0, 1, 0, 1]
    torch.save(torch.zeros(4, 3), tmp_path / "t.pt")
    assert load_data(f"pt:{tmp_path}/t.pt").labels is None


def test_text_needs_tokenizer(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello\nworld\n")
    with pytest.raises(SimkitError, match="needs a tokenizer: pass `tokenizer`='hf:DIR'"):
        load_data(f"text:{path}")
    with pytest.raises(SimkitError, match="is not a local directory; simkit never downloads"):
        load_data(f"text:{path},tokenizer=hf:gpt2")


def test_text_bytes_tokenizer(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hi\n\nhé there\nx\n", encoding="utf-8")
    data = load_data(f"text:{path},tokenizer=bytes,max_length=4", n=2)
    assert data.inputs["input_ids"].tolist() == [[104, 105, 0, 0], [104, 0xC3, 0xA9, 32]]
    assert data.inputs["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert data.info["vocab_size"] == 256 and len(data) == 2 and data.labels is None
    with pytest.raises(SimkitError, match="is not a local directory; simkit never downloads"):
        load_data(f"text:{path}", tokenizer="hf:gpt2")


def test_imagefolder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls, count in (("cat", 3), ("dog", 2)):
        (tmp_path / cls).mkdir()
        for i in range(count):
            size = (10 + i, 12)
            Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    with pytest.raises(SimkitError, match="images differ in size; add ,size=S"):
        load_data(f"imagefolder:{tmp_path}")
    data = load_data(f"imagefolder:{tmp_path},size=8")
    assert data.inputs.shape == (5, 3, 8, 8) and sorted(data.labels.tolist()) == [0, 0, 0, 1, 1]
    assert data.info["classes"] == ["cat", "dog"] and 0.0 <= float(data.inputs.min())
    assert len(load_data(f"imagefolder:{tmp_path},size=8", n=2)) == 2


def test_train_test_native_and_random():
    data = load_data("digits", n=200)
    train, test = data.train_test()
    assert test is data.test and len(train) == 200 and train.test is None
    x = torch.arange(20.0).reshape(10, 2)
    plain = Dataset(x, torch.arange(10) % 2, "mem")
    tr, te = plain.train_test(0.3, seed=1)
    assert len(tr) == 7 and len(te) == 3
    together = torch.cat([tr.inputs, te.inputs])
    assert sorted(together[:, 0].tolist()) == x[:, 0].tolist()  # a partition
    tr2, _ = plain.train_test(0.3, seed=1)
    assert torch.equal(tr.inputs, tr2.inputs)
    with pytest.raises(SimkitError, match="`test_fraction` must be between 0 and 1"):
        plain.train_test(1.5)


def test_dict_inputs_batches_and_take():
    data = Dataset({"input_ids": torch.arange(12).reshape(6, 2), "attention_mask": torch.ones(6, 2)},
                   None, "mem")
    assert len(data) == 6
    batches = list(data.batches(4))
    assert [b["input_ids"].shape[0] for b in batches] == [4, 2]
    assert data.take(slice(1, 3)).inputs["input_ids"].tolist() == [[2, 3], [4, 5]]
    mask = torch.tensor([True, False, False, False, False, True])
    assert data.take(mask).inputs["input_ids"].tolist() == [[0, 1], [10, 11]]
    assert data.take(slice(0, 6, 5)).inputs["input_ids"].tolist() == [[0, 1], [10, 11]]


@pytest.mark.parametrize(("spec", "message"), [
    ("nope", r"unknown data kind 'nope'; valid kinds: mnist1d, digits, synthetic:SHAPE"),
    ("cifar10", r"data 'cifar10' would need a download and simkit never downloads; .* npy:PATH"),
    ("https://x.org/a.npy", r"is a URL; simkit never downloads"),
    ("npy:/no/such.npy", r"file '/no/such.npy' does not exist"),
    ("npy:", r"needs a file: write it after the colon"),
    ("synthetic:3xAx4", r"synthetic needs a shape like synthetic:3x64x64"),
    ("mnist1d:foo", r"mnist1d takes no path"),
    ("digits,size=3", r"unknown option 'size'; valid options: none"),
    ("imagefolder:/no/dir", r"directory '/no/dir' does not exist"),
])
def test_bad_specs(spec, message):
    with pytest.raises(SimkitError, match=message):
        load_data(spec)


def test_bad_n_and_label_mismatch(tmp_path):
    with pytest.raises(SimkitError, match="`n` must be at least 1, got 0"):
        load_data("digits", n=0)
    np.save(tmp_path / "x.npy", np.zeros((5, 2)))
    np.save(tmp_path / "y.npy", np.zeros(4, dtype=np.int64))
    with pytest.raises(SimkitError, match="4 labels for 5 samples"):
        load_data(f"npy:{tmp_path}/x.npy,labels={tmp_path}/y.npy")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SimkitError, match=r"holds Python objects \(an object array\), which simkit does not unpickle"):
        load_data(f"npy:{tmp_path}/obj.npy")


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12), st.integers(1, 15), st.integers(0, 11), st.integers(0, 12))
def test_batches_rows_and_windows_agree(n, batch_size, start, stop):
    """Lazy and eager datasets stream, slice and window the same samples."""
    lazy = load_data("synthetic:2x3", n=n, seed=3)
    eager = Dataset(lazy.rows(0, n), torch.arange(n), "mem")
    full = eager.inputs
    assert torch.equal(torch.cat(list(lazy.batches(batch_size))), full)
    assert torch.equal(torch.cat(list(eager.batches(batch_size))), full)
    assert torch.equal(lazy.take(slice(start, stop)).inputs, full[start:stop])
    window = eager.take(slice(start, stop))
    assert torch.equal(window.inputs, full[start:stop]) and torch.equal(window.labels, torch.arange(n)[start:stop])


def test_non_numeric_arrays_are_a_clear_error(tmp_path):
    np.save(tmp_path / "words.npy", np.array(["a", "b", "c"]))
    with pytest.raises(SimkitError, match=r"inputs of type <U1 are not numbers"):
        load_data(f"npy:{tmp_path / 'words.npy'}")
    np.save(tmp_path / "x.npy", np.zeros((3, 2), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.array(["a", "b", "c"]))
    with pytest.raises(SimkitError, match=r"labels of type <U1 are not numbers"):
        load_data(f"npy:{tmp_path / 'x.npy'},labels={tmp_path / 'y.npy'}")
    np.save(tmp_path / "empty.npy", np.zeros((0, 4), dtype=np.float32))
    with pytest.raises(SimkitError, match=r"holds no samples \(shape \(0, 4\)\)"):
        load_data(f"npy:{tmp_path / 'empty.npy'}")
