"""The `attention-to-mlp` recipe (ViT → Patch-MLP) and deep-to-shallow's residual alignment."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from simkit.cli.main import app
from simkit.conversion import ConvertSettings, convert
from simkit.conversion.plans import build_target, resolve_plan
from simkit.conversion.recipes import RECIPES, attention_to_mlp, deep_to_shallow, make_plan
from simkit.conversion.schedules import guide_cache
from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.models.llama import TinyLlama
from simkit.models.small import CNN1d
from simkit.models.vit import Readout, TokenMLP, ViT

LENGTH, PATCH = 12, 3  # 4 patch tokens + the class token


def tiny_vit(seed: int = 0, **options) -> ViT:
    torch.manual_seed(seed)
    return ViT(**{"length": LENGTH, "patch": PATCH, "dim": 8, "depth": 2, "heads": 2, "num_classes": 3,
                  **options}).eval()


def tiny_data(n: int = 96, n_test: int = 48) -> Dataset:
    def signals(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, 3, (count,), generator=g)
        t = torch.arange(LENGTH, dtype=torch.float32)
        x = 0.5 * torch.randn(count, 1, LENGTH, generator=g) + torch.sin(t * 0.5 * (y[:, None] + 1)).unsqueeze(1)
        return x, y
    x, y = signals(n, 0)
    xt, yt = signals(n_test, 1)
    return Dataset(x, y, "tiny", test=Dataset(xt, yt, "tiny", info={"num_classes": 3}), info={"num_classes": 3})


def _resolve(guide: nn.Module, plan, sample: torch.Tensor):
    return resolve_plan(plan, guide, lambda m: m(sample))


def test_attention_to_mlp_pairs_each_attention_and_the_readout():
    guide = tiny_vit(mlp_ratio=3)
    assert "attention-to-mlp" in RECIPES
    plan = make_plan("attention-to-mlp", guide)
    assert [r.guide for r in plan.replacements] == ["blocks.0.attn", "blocks.1.attn", "readout"]
    slots, head = _resolve(guide, plan, torch.randn(4, 1, LENGTH))
    assert head == "head"
    assert [s.names for s in slots] == [("blocks.0.attn",), ("blocks.1.attn",), ("readout",)]
    assert [s.align for s in slots] == ["output"] * 3  # the attention's own output: its residual branch
    # the attention slots are aligned at the patch tokens only; the readout on the class-token feature
    assert [s.skip_tokens for s in slots] == [1, 1, 0]
    assert [s.in_shape for s in slots] == [(5, 8)] * 3 and slots[2].out_shape == (8,)
    mlp = slots[0].target
    assert isinstance(mlp, TokenMLP) and mlp.fc1.out_features == 24  # the width of the block's own MLP
    readout = slots[2].target
    assert isinstance(readout, Readout) and readout.pool == "mean" and readout.prefix == 1
    # the readout keeps the guide's final LayerNorm; the cache holds the guide's class-token feature
    assert torch.equal(readout.norm.weight, guide.readout.norm.weight)
    x = torch.randn(6, 1, LENGTH)
    cache = guide_cache(guide, slots, x, 4)
    with torch.no_grad():
        h = guide.embed(x)
        attn0 = guide.blocks[0].attn(guide.blocks[0].norm1(h))
        final = guide.blocks(h)
    torch.testing.assert_close(cache.outputs[0], attn0[:, 1:])  # the class token left out
    torch.testing.assert_close(cache.outputs[2], guide.readout.norm(final)[:, 0])


def test_target_keeps_everything_but_attention_and_mixes_no_tokens():
    guide = tiny_vit(seed=1)
    slots, _ = _resolve(guide, attention_to_mlp(guide), torch.randn(4, 1, LENGTH))
    target = build_target(guide, slots).eval()
    kept = {k: v for k, v in guide.state_dict().items() if ".attn." not in k}
    state = target.state_dict()
    for key, value in kept.items():  # embedding, norms, the blocks' MLPs, readout norm, head: the guide's
        assert torch.equal(state[key], value), key
    assert not any(".attn.qkv" in k for k in state)
    assert isinstance(target.blocks[0].attn, TokenMLP) and target.readout.pool == "mean"

    # perturbing one patch changes only that token's features, at every block, before the readout
    x = torch.randn(3, 1, LENGTH)
    for token in range(LENGTH // PATCH):
        y = x.clone()
        y[..., token * PATCH:(token + 1) * PATCH] += torch.randn(3, 1, PATCH)
        with torch.no_grad():
            a, b = target.embed(x), target.embed(y)
            for block in target.blocks:
                a, b = block(a), block(b)
                moved = (a - b).abs().amax(dim=(0, 2))  # (1 + T,) per token
                assert moved[1 + token] > 1e-3
                others = [i for i in range(moved.numel()) if i != 1 + token]
                assert torch.equal(a[:, others], b[:, others]), token

    # the readout is the mean of the normalised patch tokens (float64 numpy reference)
    with torch.no_grad():
        z = target.blocks(target.embed(x)).double().numpy()
        pooled = target.readout(target.blocks(target.embed(x))).double().numpy()
    w, bias = target.readout.norm.weight.detach().double().numpy(), target.readout.norm.bias.detach().double().numpy()
    patches = z[:, 1:]
    normed = (patches - patches.mean(-1, keepdims=True)) / np.sqrt(patches.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(pooled, (normed * w + bias).mean(1), rtol=1e-5, atol=1e-6)


def test_attention_to_mlp_on_a_2d_vit_and_a_causal_lm():
    torch.manual_seed(0)
    guide = ViT(size=8, patch=2, dim=8, depth=1, heads=2).eval()
    slots, _ = _resolve(guide, attention_to_mlp(guide), torch.randn(4, 1, 8, 8))
    assert [s.label for s in slots] == ["blocks.0.attn", "readout"] and slots[0].in_shape == (17, 8)
    # a causal LM without a class token: attention only (its readout is per token already)
    llama = TinyLlama(vocab=12, d=16, heads=2, blocks=2, max_len=16).eval()
    slots, head = _resolve(llama, attention_to_mlp(llama), torch.randint(0, 12, (4, 8)))
    assert [s.label for s in slots] == ["blocks.0.branch.attn", "blocks.1.branch.attn"] and head == "head"
    assert slots[0].target.fc1.out_features == 64  # SwiGLU width 4·d
    assert [s.skip_tokens for s in slots] == [0, 0]  # no class token: every token aligned


def test_attention_to_mlp_refuses_guides_it_cannot_convert():
    with pytest.raises(SimkitError, match="found no attention module"):
        attention_to_mlp(CNN1d(length=LENGTH, channels=4, layers=2))

    class ClassTokenNet(nn.Module):  # a class token read by plain indexing: nothing to make a mean of
        def __init__(self) -> None:
            super().__init__()
            self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
            self.blocks = nn.ModuleList([tiny_vit().blocks[0]])
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.blocks[0](torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1))[:, 0])

    with pytest.raises(SimkitError, match="class token but no simkit Readout"):
        attention_to_mlp(ClassTokenNet())
    # a guide that already reads out the patch mean keeps its readout
    plan = attention_to_mlp(tiny_vit(pool="mean"))
    assert [r.guide for r in plan.replacements] == ["blocks.0.attn", "blocks.1.attn"]


def test_deep_to_shallow_aligns_residual_groups_on_their_branches():
    torch.manual_seed(0)
    guide = CNN1d(length=LENGTH, channels=4, layers=4, kernel=3, residual=True).eval()
    plan = deep_to_shallow(guide, group=2)
    # blocks.0 changes the width (not residual): that group aligns on its output
    assert [(r.names, r.align) for r in plan.replacements] == [
        (("blocks.0", "blocks.1"), "output"), (("blocks.2", "blocks.3"), "delta")]
    slots, _ = _resolve(guide, plan, torch.randn(4, 1, LENGTH))
    x = torch.randn(5, 1, LENGTH)
    cache = guide_cache(guide, slots, x, 8)
    with torch.no_grad():
        h1 = guide.blocks[1](guide.blocks[0](x))
        h3 = guide.blocks[3](guide.blocks[2](h1))
    torch.testing.assert_close(cache.outputs[0], h1)
    torch.testing.assert_close(cache.outputs[1], h3 - h1)
    vit_plan = deep_to_shallow(tiny_vit(depth=4), group=2)
    assert [r.align for r in vit_plan.replacements] == ["delta", "delta"]


QUICK = dict(finetune_epochs=1, head_epochs=1, batch_size=32, finetune_batch_size=32, eval_samples=32,
             compare_layers=False)


def test_convert_a_vit_end_to_end():
    guide = tiny_vit(seed=2)
    # once every attention is gone, the guide's class-token readout (not replaced yet) reads a constant
    with pytest.warns(RuntimeWarning, match="CKA is undefined"):
        result = convert(guide, tiny_data(), ConvertSettings(
            recipe="attention-to-mlp", schedule=["progressive", "sequential"], steps_per_stage=2,
            baselines=["scratch"], baseline_epochs=2, train_guide=1, **QUICK), progress=False)
    stages = result.tables["stages"]
    before = stages.query("schedule == 'progressive' and stage == 'stage2'").set_index("layer")["value"]
    assert np.isnan(before["readout"]) and before[["blocks.0.attn", "blocks.1.attn"]].between(0, 1).all()
    assert result.summary["recipe"] == "attention-to-mlp"
    for key in ("guide_accuracy", "converted_accuracy", "scratch_accuracy", "probe_accuracy"):
        assert 0.0 <= result.summary[key] <= 1.0
    assert [s["target"] for s in result.extra["slots"]] == ["TokenMLP", "TokenMLP", "Readout"]
    summary = result.tables["stage_summary"]
    assert len(summary) == 6 and (summary["steps"] >= 1).all()  # 3 stages × 2 schedules, each trained
    sequential = summary[summary["schedule"] == "sequential"]
    assert sequential["trainable"].iloc[-1] == "readout.norm.weight;readout.norm.bias"
    finetuned = result.tables["stages"].query("stage == 'finetuned'")
    assert set(finetuned["layer"]) == {"blocks.0.attn", "blocks.1.attn", "readout"}
    assert finetuned["value"].between(0, 1).all()


@pytest.mark.filterwarnings("ignore:CKA is undefined")  # the class-token readout before it is replaced
def test_cli_converts_a_vit_with_attention_to_mlp(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "convert", "simkit:vit:size=8,patch=2,dim=8,depth=1,heads=2", "--recipe", "attention-to-mlp",
        "--data", "digits", "--n", "200", "--steps-per-stage", "2", "--finetune-epochs", "1",
        "--batch-size", "64", "--train-guide", "1", "--baselines", "scratch", "--baseline-max-epochs", "2",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "result.json").read_text())
    assert data["summary"]["recipe"] == "attention-to-mlp"
    assert 0.0 <= data["summary"]["converted_accuracy"] <= 1.0
    assert [s["target"] for s in data["extra"]["slots"]] == ["TokenMLP", "Readout"]
    assert (out / "report.html").is_file()


def test_cli_refuses_attention_to_mlp_on_a_cnn_in_one_line(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["convert", "simkit:cnn2d:channels=4,layers=2", "--recipe",
                                      "attention-to-mlp", "--data", "digits", "--n", "100", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "found no attention module" in lines[0] and "Traceback" not in result.output
    assert not out.exists()  # nothing half-written
