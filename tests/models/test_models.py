"""Model specs → modules: the zoo, torchvision, files (safetensors, TorchScript, state dicts, pickles)."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest
import torch
from torch import nn

from simkit.errors import SimkitError
from simkit.models import ZOO, load_model, save_model
from simkit.models.small import CNN1d
from simkit.models.zoo import parse_kwargs, parse_value


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)


def test_parse_values():
    assert parse_value("3") == 3 and parse_value("0.5") == 0.5 and parse_value("True") is True
    assert parse_value("none") is None and parse_value("relu") == "relu"
    assert parse_kwargs("channels=32, layers=3,batchnorm=false", "s") == {
        "channels": 32, "layers": 3, "batchnorm": False}
    with pytest.raises(SimkitError, match="'x' is not key=value"):
        parse_kwargs("x", "simkit:cnn1d:x")


def test_zoo_cnn1d_structure_and_shapes():
    model = load_model("simkit:cnn1d:channels=8,layers=3,residual=true")
    assert not model.training
    names = [n for n, _ in model.named_modules()]
    for i in range(3):
        for part in ("conv", "bn", "relu"):
            assert f"blocks.{i}.{part}" in names
    assert isinstance(model.blocks[1].relu, nn.ReLU) and "head" in names
    x = torch.randn(5, 1, 40)
    assert model(x).shape == (5, 10)
    # residual: block i>0 returns x + relu(bn(conv(x))); block 0 has no skip
    h0 = model.blocks[0](x)
    expected = h0 + model.blocks[1].relu(model.blocks[1].bn(model.blocks[1].conv(h0)))
    torch.testing.assert_close(model.blocks[1](h0), expected, rtol=0, atol=0)
    assert torch.equal(h0, model.blocks[0].relu(model.blocks[0].bn(model.blocks[0].conv(x))))


@pytest.mark.parametrize("spec", ["simkit:cnn1d:residual=true", "simkit:cnn2d", "simkit:mlp:batchnorm=true"])
def test_zoo_models_trace_with_fx(spec):
    model = load_model(spec)
    traced = torch.fx.symbolic_trace(model)
    x = torch.randn(3, 1, 8, 8) if "cnn2d" in spec else torch.randn(3, 1, 40)
    assert torch.equal(traced(x), model(x))
    assert any(node.op == "call_module" and node.target == "blocks.0.relu" for node in traced.graph.nodes)


def test_zoo_mlp_cnn2d_and_num_classes():
    mlp = load_model("simkit:mlp:in_features=64,hidden=16,depth=2", num_classes=3)
    assert mlp(torch.randn(4, 1, 8, 8)).shape == (4, 3)
    assert [n for n, _ in mlp.named_children()] == ["flatten", "blocks", "head"]
    cnn = load_model("simkit:cnn2d:channels=4,layers=2,batchnorm=false")
    assert cnn(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert isinstance(cnn.blocks[0].bn, nn.Identity) and cnn.blocks[0].conv.bias is not None
    assert "llama" in ZOO and ZOO["llama"] == "simkit.models.llama:TinyLlama"


def test_seeded_init_and_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = load_model("simkit:cnn1d:channels=4", seed=1)
    assert torch.equal(torch.rand(1), expected)  # building a model does not consume the global generator
    b = load_model("simkit:cnn1d:channels=4", seed=1)
    c = load_model("simkit:cnn1d:channels=4", seed=2)
    assert _same_state(a, b) and not _same_state(a, c)


def test_torchvision_seeded_and_unknown_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty hub cache: pretrained weights are not there
    a = load_model("torchvision:resnet18", seed=3, num_classes=7)
    b = load_model("torchvision:resnet18", seed=3, num_classes=7)
    assert _same_state(a, b) and a.fc.out_features == 7 and not a.training
    with pytest.raises(SimkitError, match=r"unknown torchvision model 'resnet81'; closest: resnet18"):
        load_model("torchvision:resnet81")
    with pytest.raises(SimkitError, match="weights are not in the torch hub cache; place the file"):
        load_model("torchvision:resnet18:weights=DEFAULT")


def test_torchvision_local_weights(tmp_path):
    source = load_model("torchvision:resnet18", seed=1)
    torch.save(source.state_dict(), tmp_path / "w.pt")
    loaded = load_model("torchvision:resnet18", seed=9, weights=str(tmp_path / "w.pt"))
    assert _same_state(source, loaded)
    with pytest.raises(SimkitError, match="do not fit the architecture"):
        load_model("torchvision:resnet34", weights=str(tmp_path / "w.pt"))


def test_save_load_round_trip_bit_exact(tmp_path):
    spec = "simkit:cnn1d:channels=6,layers=2"
    model = load_model(spec, seed=4)
    with torch.no_grad():  # make BN buffers non-trivial
        model.train()
        model(torch.randn(16, 1, 40))
        model.eval()
    path = save_model(model, tmp_path / "sub" / "m", spec)
    assert path.name == "m.safetensors"
    assert json.loads((tmp_path / "sub" / "m.safetensors.json").read_text())["spec"] == spec
    assert not list((tmp_path / "sub").glob(".*tmp"))  # atomic: no temporary left behind
    back = load_model(f"file:{path}", seed=99)
    assert _same_state(model, back) and isinstance(back, CNN1d) and not back.training
    x = torch.randn(3, 1, 40)
    assert torch.equal(model(x), back(x))
    # the architecture can also be given explicitly
    assert _same_state(model, load_model(f"file:{path},arch={spec}"))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_state_dict_needs_arch_and_torchscript(tmp_path):
    model = load_model("simkit:mlp:hidden=8,depth=1", seed=0)
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    with pytest.raises(SimkitError, match=r"is a state dict; name its architecture with file:PATH,arch=SPEC"):
        load_model(f"file:{tmp_path}/sd.pt")
    back = load_model(f"file:{tmp_path}/sd.pt,arch=simkit:mlp:hidden=8,depth=1")
    assert _same_state(model, back)
    scripted = torch.jit.script(model)
    scripted.save(str(tmp_path / "m.ts"))
    loaded = load_model(f"file:{tmp_path}/m.ts")
    x = torch.randn(2, 40)
    assert torch.equal(loaded(x), model(x))


class _Pickled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x)


def test_pickled_module_needs_trust(tmp_path):
    module = _Pickled()
    torch.save(module, tmp_path / "whole.pt")
    with pytest.raises(SimkitError, match=r"is a pickled object .* pass `trust` if you trust it"):
        load_model(f"file:{tmp_path}/whole.pt")
    loaded = load_model(f"file:{tmp_path}/whole.pt", trust=True)
    assert _same_state(module, loaded)
    with pytest.raises(SimkitError, match="is not a plain state dict"):
        load_model(f"file:{tmp_path}/whole.pt,arch=simkit:mlp")


def test_sidecar_naming_python_code_needs_trust(tmp_path, monkeypatch):
    fake = types.ModuleType("simkit_test_arch")
    fake.build = lambda: nn.Linear(2, 2)
    monkeypatch.setitem(sys.modules, "simkit_test_arch", fake)
    model = load_model("python:simkit_test_arch:build")
    path = save_model(model, tmp_path / "m", "python:simkit_test_arch:build")
    with pytest.raises(SimkitError, match=r"which imports and runs Python code; pass `trust`"):
        load_model(f"file:{path}")
    assert _same_state(model, load_model(f"file:{path}", trust=True))
    (tmp_path / "m.safetensors.json").write_text("[1]")
    with pytest.raises(SimkitError, match="is not a simkit model sidecar"):
        load_model(f"file:{path}")


def test_python_callable_from_working_directory(tmp_path, monkeypatch):
    (tmp_path / "simkit_cwd_models.py").write_text(
        "from torch import nn\n\ndef build(width=2):\n    return nn.Linear(3, width)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    model = load_model("python:simkit_cwd_models:build:width=5")
    assert model.out_features == 5 and str(tmp_path) not in sys.path
    sys.modules.pop("simkit_cwd_models", None)


def test_python_callable(monkeypatch):
    fake = types.ModuleType("simkit_test_factory")
    fake.build = lambda width=3: nn.Linear(2, width)
    fake.not_module = lambda: 5
    monkeypatch.setitem(sys.modules, "simkit_test_factory", fake)
    model = load_model("python:simkit_test_factory:build:width=4")
    assert isinstance(model, nn.Linear) and model.out_features == 4
    with pytest.raises(SimkitError, match="gave a int, not a torch nn.Module"):
        load_model("python:simkit_test_factory:not_module")
    with pytest.raises(SimkitError, match="has no attribute 'nothing'"):
        load_model("python:simkit_test_factory:nothing")
    with pytest.raises(SimkitError, match="cannot import 'no_such_pkg_xyz'"):
        load_model("python:no_such_pkg_xyz:f")


@pytest.mark.parametrize(("spec", "message"), [
    ("resnet18", r"has no kind; valid kinds: torchvision:NAME"),
    ("keras:foo", r"unknown model kind 'keras'"),
    ("simkit:cnn", r"unknown zoo model 'cnn'; closest: .*cnn1d"),
    ("simkit:cnn1d:width=3", r"simkit:cnn1d has no option 'width'; valid: in_channels, length"),
    ("simkit:cnn1d:kernel=4", r"kernel must be odd"),
    ("file:/no/such.pt", r"file '/no/such.pt' does not exist"),
    ("hf:gpt2", r"is not a local directory; simkit never downloads"),
])
def test_bad_model_specs(spec, message):
    with pytest.raises(SimkitError, match=message):
        load_model(spec)


def test_missing_optional_packages(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import fails as if not installed
    with pytest.raises(SimkitError, match=r"needs timm, which is not installed: pip install timm"):
        load_model("timm:resnet18")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(SimkitError, match=r"needs transformers, which is not installed: pip install transformers"):
        load_model(f"hf:{tmp_path}")


def test_safetensors_without_sidecar(tmp_path):
    path = save_model(load_model("simkit:mlp:hidden=4,depth=1"), tmp_path / "m.safetensors", "simkit:mlp:hidden=4,depth=1")
    (tmp_path / "m.safetensors.json").unlink()
    with pytest.raises(SimkitError, match=r"m.safetensors.json' is missing; give the architecture as file:PATH,arch=SPEC"):
        load_model(f"file:{path}")
    with pytest.raises(SimkitError, match="spec must name the architecture"):
        save_model(nn.Linear(1, 1), tmp_path / "x", "file:/a.pt")
    model = load_model("simkit:mlp:hidden=4,depth=1", num_classes=3)
    with pytest.raises(SimkitError, match=r"does not rebuild this model \(first difference: 'head.bias'\); "
                                          "give the full spec, options such as num_classes included"):
        save_model(model, tmp_path / "y", "simkit:mlp:hidden=4,depth=1")
    assert not (tmp_path / "y.safetensors").exists()
    save_model(model, tmp_path / "y", "simkit:mlp:hidden=4,depth=1,num_classes=3")


class _FakeOutput(dict):
    """Like transformers' ModelOutput: a dict with attribute access."""

    __getattr__ = dict.__getitem__


class _FakeHFBackbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, input_ids=None, attention_mask=None):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        return _FakeOutput(last_hidden_state=h)


class _FakeTokenizer:
    pad_token, eos_token, unk_token = None, "<eos>", "<unk>"

    def __len__(self):
        return 20

    def __call__(self, lines, padding, truncation, max_length, return_tensors):
        ids = [[1 + (ord(c) % 18) for c in line][:max_length] for line in lines]
        width = max(map(len, ids))
        return {"input_ids": torch.tensor([row + [0] * (width - len(row)) for row in ids]),
                "attention_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])}


def _fake_transformers(monkeypatch, seen):
    fake = types.ModuleType("transformers")

    class AutoModel:
        @staticmethod
        def from_pretrained(path, local_files_only, trust_remote_code):
            seen.append(("model", path, local_files_only))
            return _FakeHFBackbone()

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(path, local_files_only):
            seen.append(("tokenizer", path, local_files_only))
            return _FakeTokenizer()

    fake.AutoModel, fake.AutoTokenizer = AutoModel, AutoTokenizer
    monkeypatch.setitem(sys.modules, "transformers", fake)


def test_hf_wrapper_text_data_and_last_token(tmp_path, monkeypatch):
    from simkit.data import load_data
    from simkit.layers import record_layers

    seen: list = []
    _fake_transformers(monkeypatch, seen)
    model = load_model(f"hf:{tmp_path}")
    assert seen == [("model", str(tmp_path), True)] and not model.training
    (tmp_path / "t.txt").write_text("abc\n\nhello\n")
    data = load_data(f"text:{tmp_path}/t.txt,max_length=4", tokenizer=f"hf:{tmp_path}")
    assert len(data) == 2 and data.inputs["input_ids"].shape == (2, 4)
    assert data.inputs["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    batch = next(data.batches(2))
    # the model's own layer names (no wrapper prefix), its state dict keys, and its spec
    assert [name for name, _ in model.named_modules()] == ["", *(n for n, _ in model.hf_model.named_modules() if n)]
    assert list(model.state_dict()) == list(model.hf_model.state_dict())
    assert model.simkit_spec == f"hf:{tmp_path}" and model.spec == f"hf:{tmp_path}"
    with record_layers(model, "layers.1", reduce="last") as cap:
        hidden = model(**batch)
        act = cap.pop()["layers.1"]
    assert torch.equal(act[0], hidden[0, 2]) and torch.equal(act[1], hidden[1, 3])  # last real token
    model.train()
    assert model.hf_model.training and model.layers[0].training
    model.eval()
    assert not model.hf_model.training and not model.layers[0].training


def test_corrupt_safetensors_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(SimkitError, match=r"cannot read .*bad\.safetensors' as safetensors"):
        load_model(f"file:{bad},arch=simkit:cnn1d")
    with pytest.raises(SimkitError, match=r"as safetensors"):
        load_model("simkit:cnn1d", weights=str(bad))


@pytest.mark.parametrize(("spec", "message"), [
    ("simkit:llama:max_len=cls", "option max_len must be a number (default 64), got 'cls'"),
    ("simkit:cnn1d:layers=many", "option layers must be a number"),
    ("simkit:cnn1d:batchnorm=3", "option batchnorm must be true or false"),
])
def test_a_zoo_option_of_the_wrong_kind_is_one_line(spec, message):
    """Found by the CLI fuzz: a text where the factory takes a number reached torch as a raw TypeError."""
    from simkit.models import load_model

    with pytest.raises(SimkitError, match=re.escape(message)):
        load_model(spec)
