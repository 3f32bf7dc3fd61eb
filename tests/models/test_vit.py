"""`simkit:vit`: spec options, shapes, module names, a float64 numpy reference forward pass, token mixing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.special import erf
from typer.testing import CliRunner

from simkit.cli.main import app
from simkit.conversion.modules import reinitialise
from simkit.errors import SimkitError
from simkit.models import ZOO, load_model
from simkit.models.vit import Readout, ViT

# ------------------------------------------------------------------ float64 numpy reference (ViT paper)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _layer_norm(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + bias


def _linear(x, layer):
    return x @ _np(layer.weight).T + _np(layer.bias)


def _patches(x: np.ndarray, patch: int) -> np.ndarray:
    """(n, C, L) → (n, L/p, C·p) or (n, C, S, S) → (n, (S/p)², C·p·p), row-major patch order."""
    n, c = x.shape[:2]
    if x.ndim == 3:
        t = x.shape[2] // patch
        return np.stack([x[:, :, i * patch:(i + 1) * patch].reshape(n, -1) for i in range(t)], axis=1)
    side = x.shape[2] // patch
    return np.stack([x[:, :, i * patch:(i + 1) * patch, j * patch:(j + 1) * patch].reshape(n, -1)
                     for i in range(side) for j in range(side)], axis=1)


def _attention(h, attn, heads):
    n, length, d = h.shape
    dh = d // heads
    qkv = _linear(h, attn.qkv).reshape(n, length, 3, heads, dh)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (n, H, L, dh)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    weights = scores / scores.sum(-1, keepdims=True)
    y = (weights @ v).transpose(0, 2, 1, 3).reshape(n, length, d)
    return _linear(y, attn.proj)


def reference_forward(model: ViT, x: np.ndarray, heads: int, patch: int) -> np.ndarray:
    """Logits (n, classes) of ``model`` computed in float64 numpy from its weights."""
    w = _np(model.embed.proj.weight)
    tokens = _patches(x, patch) @ w.reshape(w.shape[0], -1).T + _np(model.embed.proj.bias)
    cls = np.broadcast_to(_np(model.embed.cls_token), (x.shape[0], 1, w.shape[0]))
    z = np.concatenate([cls, tokens], axis=1) + _np(model.embed.pos_embed)
    for block in model.blocks:
        h = _layer_norm(z, _np(block.norm1.weight), _np(block.norm1.bias))
        z = z + _attention(h, block.attn, heads)
        h = _layer_norm(z, _np(block.norm2.weight), _np(block.norm2.bias))
        a = _linear(h, block.mlp.fc1)
        z = z + _linear(0.5 * a * (1 + erf(a / np.sqrt(2))), block.mlp.fc2)
    norm = model.readout.norm
    z = _layer_norm(z, _np(norm.weight), _np(norm.bias))
    pooled = z[:, 0] if model.readout.pool == "cls" else z[:, 1:].mean(1)
    return _linear(pooled, model.head)


@pytest.mark.parametrize("spec, shape, heads, patch", [
    ("simkit:vit:dim=16,depth=2,heads=2,patch=4", (5, 1, 40), 2, 4),
    ("simkit:vit:size=8,patch=2,dim=12,depth=2,heads=3,num_classes=4", (5, 1, 8, 8), 3, 2),
    ("simkit:vit:in_channels=2,length=12,patch=3,dim=8,depth=1,heads=2,pool=mean,mlp_ratio=1.5", (5, 2, 12), 2, 3),
])
def test_forward_matches_a_float64_numpy_reference(spec, shape, heads, patch):
    model = load_model(spec, seed=3).double()
    for p in model.parameters():  # move away from the near-zero class token/positions of the init
        with torch.no_grad():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()),
                                     dtype=p.dtype))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        got = model(x).numpy()
    want = reference_forward(model, x.numpy(), heads, patch)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)


def test_zoo_entry_names_shapes_and_class_token():
    assert ZOO["vit"] == "simkit.models.vit:ViT"
    model = load_model("simkit:vit")
    assert model(model.example_input()).shape == (1, 10)
    assert model(torch.randn(3, 1, 40)).shape == (3, 10)  # MNIST-1D: 40 samples → 10 patches of 4
    names = dict(model.named_modules())
    for name in ("embed", "embed.proj", "blocks.0", "blocks.0.norm1", "blocks.0.attn", "blocks.0.attn.qkv",
                 "blocks.0.attn.proj", "blocks.0.norm2", "blocks.0.mlp", "blocks.0.mlp.fc1", "blocks.3.mlp.fc2",
                 "readout", "readout.norm", "head"):
        assert name in names, name
    assert "blocks.4" not in names
    assert model.embed.cls_token.shape == (1, 1, 64) and model.embed.pos_embed.shape == (1, 11, 64)
    assert isinstance(model.readout, Readout) and model.readout.pool == "cls"
    assert model.blocks[0].mlp.fc1.out_features == 128  # mlp_ratio 2
    tokens = model.embed(torch.randn(2, 1, 40))
    assert tokens.shape == (2, 11, 64) and model.blocks(tokens).shape == (2, 11, 64)
    digits = load_model("simkit:vit:size=8,patch=2,dim=32,depth=2")
    assert digits.embed(torch.randn(2, 1, 8, 8)).shape == (2, 17, 32)  # 16 patches of 2×2 + the class token
    assert digits(digits.example_input()).shape == (1, 10)


def test_seeded_and_reinitialised_without_warnings():
    a, b, c = (load_model("simkit:vit:dim=8,depth=1,heads=2", seed=s) for s in (1, 1, 2))
    assert torch.equal(a.embed.cls_token, b.embed.cls_token)
    assert not torch.equal(a.embed.cls_token, c.embed.cls_token)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every parameter has a reset: no "kept the parameters" warning
        reinitialise(a, 7)
    changed = [k for k, v in a.state_dict().items() if not torch.equal(v, before[k])]
    assert "embed.cls_token" in changed and "embed.pos_embed" in changed and "blocks.0.attn.qkv.weight" in changed


@pytest.mark.parametrize("spec, match", [
    ("simkit:vit:patch=3", "length 40 is not a multiple of patch 3"),
    ("simkit:vit:size=8,patch=3", "size 8 is not a multiple of patch 3"),
    ("simkit:vit:dim=10,heads=4", "dim 10 is not a multiple of heads 4"),
    ("simkit:vit:depth=0", "depth must be a positive integer"),
    ("simkit:vit:mlp_ratio=0", "mlp_ratio must be a positive number"),
    ("simkit:vit:pool=max", "pool must be one of cls, mean"),
    ("simkit:vit:width=3", "has no option 'width'"),
])
def test_bad_options_are_one_line_errors(spec, match):
    with pytest.raises(SimkitError, match=match):
        load_model(spec)


def test_attention_mixes_tokens_and_the_class_token_reads_the_patches():
    """The guide does mix: one perturbed patch moves every token after a block, and the logits."""
    torch.manual_seed(0)
    model = ViT(length=12, patch=3, dim=8, depth=1, heads=2).eval()
    x = torch.randn(1, 1, 12)
    y = x.clone()
    y[..., 0:3] += 1.0  # patch 0 = token 1
    with torch.no_grad():
        a, b = model.blocks(model.embed(x)), model.blocks(model.embed(y))
    moved = (a - b).abs().amax(-1)[0]
    assert bool((moved > 1e-4).all()), moved  # the class token and the other patches too
    with torch.no_grad():
        assert not torch.allclose(model(x), model(y))


def test_cli_layers_lists_the_vit():
    result = CliRunner().invoke(app, ["layers", "simkit:vit:dim=8,depth=2,heads=2"])
    assert result.exit_code == 0, result.output
    for name in ("blocks.0.attn", "blocks.1.mlp", "readout", "embed"):
        assert name in result.stdout
