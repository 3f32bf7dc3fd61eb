"""Capture: selectors, hooks that leave nothing behind, reductions, and equality with a manual forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from simkit.errors import SimkitError
from simkit.layers import glob_regex, layer_table, record_layers, reduce_activation, resolve_layers
from simkit.models import load_model


@pytest.fixture(scope="module")
def resnet():
    return load_model("torchvision:resnet18", seed=0)


def _no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not m._forward_hooks_with_kwargs
               and not m._forward_pre_hooks_with_kwargs for m in model.modules())


def test_capture_equals_manual_forward_cnn1d():
    model = load_model("simkit:cnn1d:channels=6,layers=3,residual=true", seed=1)
    x = torch.randn(7, 1, 40)
    with record_layers(model, "blocks,head") as cap:
        logits = model(x)
        acts = cap.pop()
    assert list(acts) == ["blocks.0", "blocks.1", "blocks.2", "head"]
    h = x
    for i, block in enumerate(model.blocks):  # manual forward through the submodules
        out = block.relu(block.bn(block.conv(h)))
        h = out + h if i > 0 else out
        np.testing.assert_array_equal(acts[f"blocks.{i}"].numpy(), h.reshape(7, -1).detach().numpy())
    assert torch.equal(acts["head"], logits.detach())
    assert cap.shapes["blocks.0"] == (7, 6, 40) and cap.dims["blocks.0"] == 240
    assert cap.reductions == dict.fromkeys(acts, "flatten")


def test_capture_equals_forward_hooks_resnet_with_inplace_ops(resnet):
    layers = resolve_layers(resnet, "blocks")
    x1, x2 = torch.randn(2, 3, 32, 32), torch.randn(3, 3, 32, 32)
    modules = dict(resnet.named_modules())
    for x in (x1, x2, x1):  # several batches: bn1's output is changed in place by the ReLU after it
        reference: dict[str, torch.Tensor] = {}

        def keep(name, store=reference):
            return lambda m, a, o: store.__setitem__(name, o.detach().clone().reshape(o.shape[0], -1))

        handles = [modules[n].register_forward_hook(keep(n)) for n in layers]
        with torch.no_grad():
            resnet(x)
        for handle in handles:
            handle.remove()
        with record_layers(resnet, layers) as cap:
            for _ in range(2):
                resnet(x)
                acts = cap.pop()
                for name in layers:
                    assert torch.equal(acts[name], reference[name]), name
        assert "bn1" in cap.mutated and "layer1.0" not in cap.mutated
    # bn1's captured values are the pre-ReLU ones (they have negatives)
    assert float(acts["bn1"].min()) < 0


def test_hooks_removed_and_modes_restored_after_exit_and_error():
    model = load_model("simkit:cnn1d:channels=4,layers=2")
    model.train()
    model.blocks[1].eval()  # a mixed state must come back exactly
    before = {n: m.training for n, m in model.named_modules()}
    with record_layers(model, "blocks") as cap:
        assert not model.training and not model.blocks[0].bn.training
        assert not torch.is_grad_enabled()
        model(torch.randn(3, 1, 40))
        acts = cap.pop()
    assert torch.is_grad_enabled() and _no_hooks(model)
    assert {n: m.training for n, m in model.named_modules()} == before
    assert not any(a.requires_grad for a in acts.values()) and all(a.grad_fn is None for a in acts.values())
    with pytest.raises(RuntimeError, match="boom"), record_layers(model, "blocks"):
        model(torch.randn(3, 1, 40))
        raise RuntimeError("boom")
    assert _no_hooks(model) and torch.is_grad_enabled()
    assert {n: m.training for n, m in model.named_modules()} == before


def test_grad_option_keeps_graph():
    model = load_model("simkit:mlp:hidden=8,depth=2")
    with record_layers(model, "blocks.1", grad=True, eval_mode=False) as cap:
        model(torch.randn(4, 40))
        act = cap.pop()["blocks.1"]
    act.sum().backward()
    assert model.blocks[0].fc.weight.grad is not None


def test_selectors(resnet):
    assert resolve_layers(resnet, "blocks") == [
        "conv1", "bn1", "relu", "maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1",
        "layer3.0", "layer3.1", "layer4.0", "layer4.1", "avgpool", "fc"]
    assert len(resolve_layers(load_model("torchvision:resnet34"), "blocks")) == 22
    assert resolve_layers(resnet, "layer*.?") == [f"layer{i}.{j}" for i in range(1, 5) for j in (0, 1)]
    assert resolve_layers(resnet, "fc, layer1.0,layer1.0") == ["layer1.0", "fc"]  # module order, no duplicates
    assert resolve_layers(resnet, ["type:Linear", "conv1"]) == ["conv1", "fc"]
    assert resolve_layers(resnet, "**.downsample.0") == ["layer2.0.downsample.0", "layer3.0.downsample.0",
                                                          "layer4.0.downsample.0"]
    assert len(resolve_layers(resnet, "type:BasicBlock")) == 8
    mobilenet = resolve_layers(load_model("torchvision:mobilenet_v2"), "blocks")
    assert mobilenet == [f"features.{i}" for i in range(19)] + ["classifier"]
    zoo = load_model("simkit:cnn2d:layers=2")
    assert resolve_layers(zoo, "blocks") == ["blocks.0", "blocks.1"]
    plain = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert resolve_layers(plain, "blocks") == ["0", "1", "2"]
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2,
                                    enable_nested_tensor=False)
    assert resolve_layers(encoder, "blocks") == ["layers.0", "layers.1"]


def test_glob_regex():
    assert glob_regex("layer*.?").fullmatch("layer1.0")
    assert not glob_regex("layer*.?").fullmatch("layer2.0.downsample.0")
    assert glob_regex("**.bn?").fullmatch("a.b.bn1")
    assert glob_regex("layer[!1].0").fullmatch("layer2.0") and not glob_regex("layer[!1].0").fullmatch("layer1.0")


@pytest.mark.parametrize(("selector", "message"), [
    ("layer1.9", r"unknown layer 'layer1.9'; closest: layer1\.\d.*; run `simkit layers MODEL` to list them"),
    ("type:Conv3d", r"unknown module type 'Conv3d'; closest: Conv2d"),
    ("layer9*", r"layer pattern 'layer9\*' matches no module; closest: .*run `simkit layers MODEL`"),
    ("", r"no layers selected"),
])
def test_selector_errors(resnet, selector, message):
    with pytest.raises(SimkitError, match=message):
        resolve_layers(resnet, selector)


def test_layer_did_not_run_or_ran_twice():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()
            self.unused = nn.Linear(1, 1)

        def forward(self, x):
            return self.act(self.act(x) - 1)

    model = Shared()
    with record_layers(model, "act") as cap:
        model(torch.randn(2, 3))
        with pytest.raises(SimkitError, match=r"layer 'act' ran 2 times in one forward pass"):
            cap.pop()
    with record_layers(model, "unused") as cap:
        model(torch.randn(2, 3))
        with pytest.raises(SimkitError, match=r"layer 'unused' did not run in the forward pass"):
            cap.pop()
    assert _no_hooks(model)


class _TupleDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return {"last_hidden_state": h, "hidden_states": (x, h * 2)}


class _Seq(nn.Module):
    """A token model: (b, L) ids → (b, L, d); holds an attention module so 3-D outputs are tokens."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.attention = nn.MultiheadAttention(4, 1, batch_first=True)
        self.tuple_out = _TupleDict()

    def forward(self, input_ids, attention_mask=None):
        h = self.embed(input_ids)
        return self.tuple_out(h)["last_hidden_state"]


def test_tuple_and_dict_outputs_with_index():
    model = _Seq()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    h = model.embed(ids).detach()
    expected = model.tuple_out.lin(h).detach()
    with record_layers(model, "tuple_out", reduce="flatten") as cap:
        model(ids)
        assert torch.equal(cap.pop()["tuple_out"], expected.reshape(2, -1))  # default: last_hidden_state
    with pytest.raises(SimkitError, match="layer 'tuple_out' outputs tuple, not a tensor"), \
            record_layers(model, "tuple_out", output_index="hidden_states"):
        model(ids)
    with record_layers(model, "tuple_out", output_index="hidden_states.1", reduce="flatten") as cap:  # dotted
        model(ids)
        assert torch.equal(cap.pop()["tuple_out"], 2 * expected.reshape(2, -1))
    for index in (0, "0"):  # "0" as the command line passes it
        with record_layers(model, "tuple_out", output_index=index, reduce="flatten") as cap:
            model(ids)
            assert torch.equal(cap.pop()["tuple_out"], expected.reshape(2, -1))
    with pytest.raises(SimkitError, match=r"output index 'nope' does not select a tensor"), \
            record_layers(model, "tuple_out", output_index="nope"):
        model(ids)


def test_token_reductions_with_attention_mask():
    model = _Seq()
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    h = model.embed(ids).detach().numpy().astype(np.float64)
    results = {}
    for how in ("mean", "cls", "last"):
        with record_layers(model, "embed", reduce=how) as cap:
            model(ids, attention_mask=mask)
            results[how] = cap.pop()["embed"].double().numpy()
            assert cap.reductions["embed"] == how
    m = mask.numpy()[:, :, None]
    np.testing.assert_allclose(results["mean"], (h * m).sum(1) / m.sum(1), rtol=1e-6)
    np.testing.assert_allclose(results["cls"], h[:, 0], rtol=1e-6)
    np.testing.assert_allclose(results["last"], h[[0, 1], [2, 1]], rtol=1e-6)
    with record_layers(model, "embed", reduce="last") as cap:  # no mask: the last position
        model(ids)
        np.testing.assert_allclose(cap.pop()["embed"].numpy(), h[:, -1], rtol=1e-6)
    # the default (auto) is the mask-aware mean for token sequences: padding never enters
    with record_layers(model, "embed") as cap:
        model(ids, attention_mask=mask)
        np.testing.assert_allclose(cap.pop()["embed"].double().numpy(), results["mean"], rtol=1e-12)
        assert cap.reductions["embed"] == "mean"
    with record_layers(model, "embed", reduce="flatten") as cap:  # asked for: the padded positions stay
        model(ids, attention_mask=mask)
        np.testing.assert_allclose(cap.pop()["embed"].numpy(), h.reshape(2, -1), rtol=1e-6)
        assert cap.reductions["embed"] == "flatten"


def test_auto_flattens_channel_maps():
    model = load_model("simkit:cnn2d:channels=3,layers=1")
    x = torch.randn(5, 1, 8, 8)
    with record_layers(model, "blocks.0") as cap:
        model(x)
        act = cap.pop()["blocks.0"]
    np.testing.assert_array_equal(act.numpy(), model.blocks[0](x).detach().reshape(5, -1).numpy())
    assert cap.reductions == {"blocks.0": "flatten"}


def test_conv_reductions():
    model = load_model("simkit:cnn2d:channels=3,layers=1")
    x = torch.randn(5, 1, 8, 8)
    with record_layers(model, "blocks.0,head", reduce="mean") as cap:
        model(x)
        acts = cap.pop()
    manual = model.blocks[0](x).detach().double().numpy()
    np.testing.assert_allclose(acts["blocks.0"].numpy(), manual.mean(axis=(2, 3)), rtol=1e-5, atol=1e-7)
    assert cap.reductions == {"blocks.0": "mean", "head": "flatten"}  # a (b, d) output stays as it is
    with pytest.raises(SimkitError, match=r"reduction 'cls' needs a token sequence \(b, L, d\)"), \
            record_layers(model, "blocks.0", reduce="cls"):
        model(x)
    with pytest.raises(SimkitError, match="unknown reduction 'max'; choose one of auto, flatten, mean, cls, last"):
        record_layers(model, "blocks.0", reduce="max")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.integers(0, 2**31 - 1))
def test_reduce_matches_numpy(shape, seed):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    a = t.numpy()
    np.testing.assert_array_equal(reduce_activation(t, "flatten").numpy(), a.reshape(shape[0], -1))
    mean = a.mean(axis=tuple(range(2, a.ndim))) if a.ndim > 2 else a
    np.testing.assert_allclose(reduce_activation(t, "mean").numpy(), mean, rtol=1e-12)
    if a.ndim == 3:
        np.testing.assert_allclose(reduce_activation(t, "mean", layout="tokens").numpy(), a.mean(1), rtol=1e-12)
        np.testing.assert_array_equal(reduce_activation(t, "last", layout="tokens").numpy(), a[:, -1])


def test_layer_table(resnet):
    table = layer_table(resnet, torch.randn(4, 3, 32, 32))
    row = table.set_index("name").loc["layer2.0"]
    assert row["type"] == "BasicBlock" and row["shape"] == "128x4x4" and bool(row["blocks"])
    assert row["params"] == sum(p.numel() for p in resnet.layer2[0].parameters())
    assert table["blocks"].sum() == 14 and _no_hooks(resnet) and not resnet.training
    bare = layer_table(resnet)
    assert (bare["shape"] == "").all() and len(bare) == len(table)


def test_llama_blocks_tokens_and_manual_forward():
    model = load_model("simkit:llama:d=16,heads=2,blocks=2,max_len=8", seed=0)
    assert resolve_layers(model, "blocks") == ["blocks.0", "blocks.1"]
    ids = torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    with record_layers(model, "blocks", reduce="last") as cap:
        model(ids)
        acts = cap.pop()
    assert cap.layout == "tokens" and cap.shapes["blocks.1"] == (3, 6, 16)
    with torch.no_grad():
        h = model.embed(ids)
        for i, block in enumerate(model.blocks):
            h = block(h)
            assert torch.equal(acts[f"blocks.{i}"], h[:, -1])
    table = layer_table(model, ids).set_index("name")
    assert table.loc["blocks", "shape"] == "(container)" and table.loc["blocks.0", "shape"] == "6x16"


def test_per_layer_reductions_and_late_inplace_change_is_an_error():
    class Sometimes(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv1d(1, 2, 1)

        def forward(self, x):
            h = self.a(x)
            if x.sum() > 0:  # changes a's output in place, but only on some inputs
                h.mul_(2)
            return h

    model = Sometimes()
    negative, positive = -torch.ones(2, 1, 3), torch.ones(2, 1, 3)
    with record_layers(model, "a", reduce={"a": "mean"}) as cap:
        model(positive)
        assert torch.equal(cap.pop()["a"], expected_mean := model.a.forward(positive).mean(2).detach())
        assert cap.reductions == {"a": "mean"} and expected_mean.shape == (2, 2)  # a new tensor: safe
    with record_layers(model, "a") as cap:
        model(negative)
        cap.pop()  # first forward: no change in place, so later batches keep views
        model(positive)
        with pytest.raises(SimkitError, match="changed this output in place after it was captured"):
            cap.pop()
    expected = model.a(positive).detach().reshape(2, -1)
    with record_layers(model, "a") as cap:
        model(positive)  # changed on the first forward: every batch is cloned from now on
        assert torch.equal(cap.pop()["a"], expected) and cap.mutated == {"a"}
        model(positive)
        assert torch.equal(cap.pop()["a"], expected)
