"""Surgery: bit-exact grafts (E1), preconditions, gates, optimizer continuity, graft log, cones."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from simkit.errors import SimkitError
from simkit.io import write_text
from simkit.models.llama import TinyLlama
from simkit.surgery import (
    CachedRunner,
    GatedResidual,
    GraftLog,
    MLPBranch,
    add_new_params,
    bit_mismatches,
    downstream_cone,
    graft_gated_residual,
    insert_after,
    replace_module,
    trace,
)


def np_bits(t: torch.Tensor) -> np.ndarray:
    a = t.detach().numpy()
    return a.view({4: np.uint32, 8: np.uint64, 2: np.uint16}[a.itemsize])


def np_mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((np_bits(a) != np_bits(b)).sum())


def llama(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyLlama(**{"d": 32, "blocks": 2, **kw}).eval()


def ids(b=4, t=16, seed=1):
    return torch.randint(0, 50, (b, t), generator=torch.Generator().manual_seed(seed))


class LNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 24)
        self.ln = nn.LayerNorm(24)
        self.mid = nn.Linear(24, 24)
        self.out = nn.Linear(24, 5)

    def forward(self, x):
        return self.out(torch.tanh(self.mid(self.ln(self.inp(x)))))


def conv_net(dims: int):
    torch.manual_seed(0)
    conv, bn = (nn.Conv1d, nn.BatchNorm1d) if dims == 1 else (nn.Conv2d, nn.BatchNorm2d)
    return nn.Sequential(conv(1, 6, 3, padding=1), bn(6), nn.ReLU(), conv(6, 6, 3, padding=1), nn.Flatten()).eval()


@pytest.mark.parametrize("branch", ["llama", "mlp"])
@pytest.mark.parametrize("after", ["blocks.0", "blocks.1", "embed"])
def test_e1_llama_rmsnorm_zero_bit_mismatches(branch, after):
    model, x = llama(), ids(b=4, t=25)
    reference = model(x)
    g = graft_gated_residual(model, after, branch, "shadow", probe=x, seed=3)
    assert g.values_compared == reference.numel() >= 1600
    assert g.mismatches == 0 and g.site_mismatches == 0 and g.preconditions["violations"] == 0
    assert np_mismatches(reference, model(x)) == 0  # independent check with numpy integer views
    assert isinstance(model.get_submodule(f"{after}.1"), GatedResidual)


@pytest.mark.parametrize("dims", [1, 2])
def test_e1_conv_maps_and_layernorm_zero_mismatches(dims):
    model = conv_net(dims)
    x = torch.randn(5, 1, *([12] * dims), generator=torch.Generator().manual_seed(0))
    reference = model(x)
    g = graft_gated_residual(model, "1", "conv", "shadow", probe=x)  # after BatchNorm, before ReLU
    assert g.mismatches == 0 and g.values_compared == reference.numel()
    assert np_mismatches(reference, model(x)) == 0
    net = LNNet().eval()
    x = torch.randn(70, 8)
    reference = net(x)
    g = graft_gated_residual(net, "ln", "mlp", "net2net", probe=x)
    assert g.mismatches == 0 and np_mismatches(reference, net(x)) == 0
    assert net.ln[1].alpha.item() == 1.0 and torch.count_nonzero(net.ln[1].branch.out.weight) == 0


class NegRelu(nn.Module):
    def forward(self, x):
        return -torch.relu(x)  # −0.0 wherever x ≤ 0


def test_negative_zero_precondition_caught_and_mismatches_predicted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), NegRelu(), nn.Linear(10, 3)).eval()
    x = torch.randn(40, 6)
    stream = model[1](model[0](x)).detach()
    g = graft_gated_residual(model, "1", "mlp", "shadow", probe=x, seed=2)
    negzero = (stream == 0) & torch.signbit(stream)
    assert g.preconditions["stream_negative_zeros"] == int(negzero.sum()) > 0
    assert g.preconditions["violations"] >= int(negzero.sum())
    # −0.0 + 0·r is +0.0 exactly where 0·r is +0.0, i.e. where r is not negative
    r = model[1][1].branch(stream).detach()
    expected = int((negzero & ~torch.signbit(r)).sum())
    assert g.site_mismatches == expected > 0


def test_nonfinite_precondition_counted():
    class Inf(nn.Module):
        def forward(self, x):
            return torch.where(x > 1.5, torch.full_like(x, float("inf")), x)

    model = nn.Sequential(nn.Identity(), Inf(), nn.Linear(4, 2)).eval()
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    g = graft_gated_residual(model, "1", "mlp", "shadow", probe=x)
    assert g.preconditions["stream_nonfinite"] == int((x > 1.5).sum()) > 0
    assert g.preconditions["branch_nonfinite"] > 0 and g.mismatches > 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=30),
       st.lists(st.integers(0, 29), max_size=5))
def test_bit_mismatches_matches_numpy_integer_views(values, flips):
    a = torch.tensor(values, dtype=torch.float32)
    b = a.clone()
    for i in flips:
        if i < len(values):
            b[i] = -b[i]  # sign flips: +0 ↔ −0 count, NaN stays a NaN with another sign bit
    assert bit_mismatches(a, b) == np_mismatches(a, b)
    assert bit_mismatches(a, a.clone()) == 0


def test_bit_mismatches_signed_zero_and_errors():
    assert bit_mismatches(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0])) == 1
    assert bit_mismatches(torch.tensor([0.0], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)) == 0
    with pytest.raises(SimkitError, match=r"equal shapes and dtypes, got \(2,\) torch.float32 and \(3,\)"):
        bit_mismatches(torch.zeros(2), torch.zeros(3))


def _grads(gate: GatedResidual):
    return float(gate.alpha.grad.abs()), max(float(p.grad.abs().max()) for p in gate.branch.parameters())


def test_gate_gradients_at_first_step():
    x = ids()
    target = torch.randint(0, 50, x.shape, generator=torch.Generator().manual_seed(7))
    found = {}
    for gate in ("shadow", "net2net", "double_zero"):
        model = llama()
        g = graft_gated_residual(model, "blocks.0", "mlp", gate, probe=x, allow_double_zero=True)
        nn.functional.cross_entropy(model(x).flatten(0, 1), target.flatten()).backward()
        found[gate] = _grads(g.gate)
    assert found["shadow"][0] > 0 and found["shadow"][1] == 0  # α moves at step 1, θ only after
    assert found["net2net"][0] == 0 and found["net2net"][1] > 0  # R(x) = 0 so ∂L/∂α = 0; W_out learns
    assert found["double_zero"] == (0.0, 0.0)


def test_double_zero_refused():
    with pytest.raises(SimkitError, match="double-zero graft refused: .* nothing would ever train"):
        graft_gated_residual(llama(), "blocks.0", "mlp", "double_zero", probe=ids())

    class Zero(nn.Module):
        def forward(self, x):
            return torch.zeros_like(x)

    with pytest.raises(SimkitError, match="nothing would ever train"):
        graft_gated_residual(llama(), "blocks.0", Zero(), "shadow", probe=ids())


def test_errors_name_shape_edge_and_gate():
    with pytest.raises(SimkitError, match=r"unknown module 'blocks\.7'; closest: blocks\.1, blocks\.0"):
        graft_gated_residual(llama(), "blocks.7", "mlp", probe=ids())
    with pytest.raises(SimkitError, match=r"branch output shape \(4, 16, 33\) differs from the stream shape \(4, 16, 32\)"):
        graft_gated_residual(llama(), "blocks.0", nn.Linear(32, 33), probe=ids())
    with pytest.raises(SimkitError, match="unknown gate 'zero'"):
        graft_gated_residual(llama(), "blocks.0", "mlp", "zero", probe=ids())
    with pytest.raises(SimkitError, match="branch 'conv' needs a"):
        graft_gated_residual(LNNet(), "ln", "conv", probe=torch.randn(3, 8))
    with pytest.raises(SimkitError, match="sized from a probe batch"):
        graft_gated_residual(llama(), "blocks.0", "mlp")

    class Pair(nn.Module):
        def forward(self, x):
            return x, x

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.p, self.lin = Pair(), nn.Linear(3, 3)

        def forward(self, x):
            a, b = self.p(x)
            return self.lin(self.lin(a + b))

    with pytest.raises(SimkitError, match="output of 'p' is a tuple, not one tensor: this edge cannot carry"):
        graft_gated_residual(Two(), "p", "mlp", probe=torch.randn(2, 3))
    with pytest.raises(SimkitError, match="module 'lin' ran 2 times in one forward pass"):
        graft_gated_residual(Two(), "lin", "mlp", probe=torch.randn(2, 3))


def test_untraceable_model_error():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x) if x.sum() > 0 else -x

    with pytest.raises(SimkitError, match="torch.fx cannot trace Branchy .*pass the untraceable part as a leaf"):
        trace(Branchy())


def _snapshot(opt):
    return {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for p, s in opt.state.items()}


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_optimizer_state_of_old_params_untouched(kind):
    model, x = llama(), ids()
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
            "adam": lambda p: torch.optim.Adam(p, lr=1e-3), "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3)}
    opt = make[kind](model.parameters())
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    before, state_objects = _snapshot(opt), {id(p): s for p, s in opt.state.items()}
    groups = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    old_params = list(opt.param_groups[0]["params"])
    g = graft_gated_residual(model, "blocks.1", "mlp", probe=x, optimizer=opt)
    assert len(opt.param_groups) == 2 and opt.param_groups[0]["params"] == old_params
    assert [{k: v for k, v in gr.items() if k != "params"} for gr in opt.param_groups[:1]] == groups
    assert opt.param_groups[1]["params"] == list(g.gate.parameters())
    assert opt.param_groups[1]["lr"] == opt.param_groups[0]["lr"]
    after = _snapshot(opt)
    assert set(after) == set(before)
    for pid, state in before.items():
        assert {id(p): s for p, s in opt.state.items()}[pid] is state_objects[pid]
        for key, value in state.items():
            assert torch.equal(after[pid][key], value) if torch.is_tensor(value) else after[pid][key] == value
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    assert g.gate.alpha.item() != 0.0  # the new parameters train in the same optimizer


def test_warm_start_second_moment():
    model, x = llama(), ids()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(x).pow(2).mean().backward()
    opt.step()
    expected = np.mean(np.concatenate([s["exp_avg_sq"].double().numpy().ravel() for s in opt.state.values()]))
    g = graft_gated_residual(model, "blocks.0", "mlp", probe=x, optimizer=opt, warm_start_second_moment=True)
    for p in g.gate.parameters():
        st_ = opt.state[p]
        np.testing.assert_allclose(st_["exp_avg_sq"].double().numpy(), expected, rtol=1e-6)
        assert torch.count_nonzero(st_["exp_avg"]) == 0 and float(st_["step"]) == 1.0
    sgd = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(SimkitError, match="warm_start_second_moment needs Adam or AdamW"):
        add_new_params(sgd, [nn.Parameter(torch.zeros(1))], warm_start_second_moment=True)
    with pytest.raises(SimkitError, match="already in the optimizer"):
        add_new_params(sgd, list(sgd.param_groups[0]["params"]))


def test_graft_log_replay_rebuilds_model_and_optimizer(tmp_path):
    model, x = llama(), ids()
    opt = torch.optim.AdamW(model.parameters())
    log = GraftLog()
    graft_gated_residual(model, "blocks.0", "llama", "shadow", probe=x, seed=4, optimizer=opt, log=log)
    graft_gated_residual(model, "blocks.1", "mlp", "net2net", probe=x, seed=5, optimizer=opt, log=log)
    write_text(tmp_path / "log.json", log.to_json())
    rebuilt = llama()
    opt2 = torch.optim.AdamW(rebuilt.parameters())
    GraftLog.from_json((tmp_path / "log.json").read_text()).replay(rebuilt, opt2)
    a, b = model.state_dict(), rebuilt.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [len(g["params"]) for g in opt.param_groups] == [len(g["params"]) for g in opt2.param_groups]
    assert np_mismatches(model(x), rebuilt(x)) == 0
    user = GraftLog()
    replace_module(model, "norm", nn.Identity(), log=user)
    with pytest.raises(SimkitError, match=r"record 0 \(replace 'norm'\) used a user module"):
        user.replay(llama())
    user.replay(rebuilt, modules={0: nn.Identity()})
    assert isinstance(rebuilt.norm, nn.Identity)


def test_replace_and_insert_after():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    log = GraftLog()
    old = replace_module(model, "1", nn.Tanh(), log=log)
    assert isinstance(old, nn.ReLU) and isinstance(model[1], nn.Tanh)
    chain = insert_after(model, "2", nn.Softmax(dim=-1), log=log)
    assert chain[0] is model[2][0] and model(torch.randn(5, 3)).sum().item() == pytest.approx(5.0)
    assert [r["op"] for r in log] == ["replace", "insert_after"]
    with pytest.raises(SimkitError, match="unknown module '7'"):
        replace_module(model, "7", nn.Identity())


def test_cone_and_cached_runner_recompute_exactly_the_cone():
    torch.manual_seed(0)
    layers, k = 7, 2
    model = nn.Sequential(*[nn.Linear(5, 5) for _ in range(layers)])
    x = torch.randn(3, 5)
    gm = trace(model)
    cone = downstream_cone(gm, str(k))
    assert [n.name for n in cone] == [f"_{i}" for i in range(k + 1, layers)] + ["output"]
    runner = CachedRunner(gm)
    runner.run(x)
    assert len(runner.recomputed) == layers + 1  # every layer and the output
    runner.run(x)
    assert runner.recomputed == []  # all cached
    gate = GatedResidual(MLPBranch(5), alpha=0.5)
    new = runner.graft(str(k), gate, "graft0")
    out = runner.run(x)
    assert runner.recomputed == [new.name] + [n.name for n in downstream_cone(runner.module, new)]
    assert len(runner.recomputed) == 1 + (layers - 1 - k) + 1
    direct = copy.deepcopy(model)
    insert_after(direct, str(k), copy.deepcopy(gate))
    assert np_mismatches(out, direct(x)) == 0


def test_cached_runner_feeds_only_the_chosen_consumer():
    class Res(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return self.c(self.b(h) + h)

    torch.manual_seed(0)
    model, x = Res(), torch.randn(2, 4)
    runner = CachedRunner(trace(model))
    runner.run(x)
    gate = GatedResidual(MLPBranch(4), alpha=1.0)
    runner.graft("a", gate, "g", consumers=["b"])
    out = runner.run(x)
    assert runner.recomputed == ["g", "b", "add", "c", "output"]
    h = model.a(x)
    expected = model.c(model.b(gate(h)) + h)
    assert np_mismatches(out, expected) == 0
    with pytest.raises(SimkitError, match="unknown consumer node 'zz'"):
        CachedRunner(trace(model)).graft("a", gate, "g2", consumers=["zz"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32, min_value=-2.0**90, max_value=2.0**90),
                min_size=8, max_size=8), st.booleans())
def test_shadow_gate_identity_iff_no_negative_zero(values, with_negative_zero):
    """Property: x + 0·R(x) has the bits of x except where x is −0.0 and 0·R(x) is +0.0."""
    x = torch.tensor(values, dtype=torch.float32).reshape(2, 4)
    x = torch.where((x == 0) & torch.signbit(x), torch.zeros_like(x), x)  # start with no −0.0
    if with_negative_zero:
        x[0, 1] = -0.0
    torch.manual_seed(0)
    gate = GatedResidual(MLPBranch(4), alpha=0.0)
    with torch.no_grad():
        y, r = gate(x), gate.branch(x)
    expected = int(((x == 0) & torch.signbit(x) & ~torch.signbit(r)).sum()) if torch.isfinite(r).all() else None
    if expected is not None:
        assert bit_mismatches(x, y) == np_mismatches(x, y) == expected

