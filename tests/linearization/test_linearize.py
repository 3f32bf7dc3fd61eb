"""Swapping ReLUs for slopes (bit-exact at α = 0), the penalty, the freeze rule, folding, the runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.linearization import LinearizeSettings, linearize
from simkit.linearization.fold import fold_linear_stretches
from simkit.linearization.prelu import explicit_relus, swap_relus
from simkit.linearization.runner import post_train
from simkit.linearization.slope import FreezeRule, SlopeReLU, slope_modules, slope_penalty


def bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy().view(np.int32)


class Mixed(nn.Module):
    """Every way to write a ReLU: a shared module called twice, F.relu, torch.relu, in-place x.relu_()."""

    def __init__(self, c: int = 3):
        super().__init__()
        self.conv1 = nn.Conv1d(1, c, 3, padding=1)
        self.bn = nn.BatchNorm1d(c)
        self.conv2 = nn.Conv1d(c, c, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(c * 8, 4)

    def forward(self, x):
        h = self.relu(self.bn(self.conv1(x)))
        h = h + self.relu(self.conv2(h))            # residual, same module object again
        h = F.relu(h)
        h = h.view(h.size(0), -1) * 2.0
        h.relu_()
        return self.fc(torch.relu(h))


def trained_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """Perturb BN statistics so the net is not at its init (outputs have mixed signs everywhere)."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return model.eval()


finite32 = arrays(np.float32, st.integers(1, 64),
                  elements=st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True))


@given(finite32)
@settings(max_examples=200, deadline=None)
def test_alpha_zero_is_relu_bit_for_bit(values):
    x = torch.from_numpy(np.concatenate([values, np.float32([0.0, -0.0, -1e-45, 1e-45])])).view(1, -1)
    np.testing.assert_array_equal(bits(SlopeReLU(1)(x)), bits(torch.relu(x)))
    channel = SlopeReLU(x.shape[1])
    np.testing.assert_array_equal(bits(channel(x)), bits(torch.relu(x)))


def test_the_naive_formula_is_not_bit_exact():
    """Why the forward is relu(x) − α·relu(−x): where(x >= 0, x, α·x) gives −0.0 for negative x."""
    x = torch.tensor([[-2.0, -0.0, 3.0]])
    naive = torch.where(x >= 0, x, torch.zeros(()) * x)
    assert not np.array_equal(bits(naive), bits(torch.relu(x)))
    np.testing.assert_array_equal(bits(SlopeReLU(1)(x)), bits(torch.relu(x)))
    assert torch.isnan(SlopeReLU(1)(torch.tensor([[float("nan")]]))).all()


@given(arrays(np.float64, (3, 4, 5), elements=st.floats(-10, 10)),
       arrays(np.float64, (4,), elements=st.floats(-2, 2)))
@settings(max_examples=50, deadline=None)
def test_slope_relu_values_match_numpy(x, alpha):
    module = SlopeReLU(4).double()
    with torch.no_grad():
        module.alpha.copy_(torch.from_numpy(alpha))
    expected = np.where(x > 0, x, alpha[None, :, None] * x)
    np.testing.assert_allclose(module(torch.from_numpy(x)).detach().numpy(), expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("granularity", ["channel", "layer"])
def test_swap_gives_each_site_its_own_module_and_same_bits(granularity):
    torch.manual_seed(0)
    model = trained_like(Mixed())
    x = torch.randn(16, 1, 8)
    swapped, sites = swap_relus(model, granularity, x[:2])
    slopes = list(slope_modules(swapped))
    assert len(slopes) == len(sites) == 5
    assert len({id(m) for _, m in slopes}) == 5
    want = [3, 3, 3, 24, 24] if granularity == "channel" else [1] * 5
    assert [m.channels for _, m in slopes] == want
    np.testing.assert_array_equal(bits(swapped(x)), bits(model(x)))
    assert not any(isinstance(m, nn.ReLU) for m in swapped.modules())
    assert any(isinstance(m, nn.ReLU) for m in model.modules())   # the original is untouched


def test_swapped_slopes_follow_the_model_dtype():
    torch.manual_seed(0)
    model = trained_like(Mixed()).double()
    x = torch.randn(8, 1, 8, dtype=torch.float64)
    swapped, _ = swap_relus(model, "channel", x[:2])
    assert {m.alpha.dtype for _, m in slope_modules(swapped)} == {torch.float64}
    assert {m.frozen.dtype for _, m in slope_modules(swapped)} == {torch.bool}
    np.testing.assert_array_equal(swapped(x).detach().numpy(), model(x).detach().numpy())


def test_swap_changes_outputs_once_slopes_move():
    """Guards the bitwise test: the swapped net depends on α (the comparison can fail)."""
    torch.manual_seed(0)
    model = trained_like(Mixed())
    x = torch.randn(16, 1, 8)
    swapped, _ = swap_relus(model, "layer", x[:2])
    with torch.no_grad():
        for _, m in slope_modules(swapped):
            m.alpha.fill_(0.5)
    assert not torch.equal(swapped(x), model(x))


def test_torchvision_resnet_swap_is_bit_exact():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()
    x = torch.randn(2, 3, 32, 32)
    swapped, sites = swap_relus(model, "channel", x)
    assert len(sites) == 17                                      # stem + 2 per block × 8 blocks
    np.testing.assert_array_equal(bits(swapped(x)), bits(model(x)))


def test_penalty_matches_numpy_and_skips_frozen():
    a, b = SlopeReLU(3), SlopeReLU(1)
    with torch.no_grad():
        a.alpha.copy_(torch.tensor([0.0, 0.5, 1.5]))
        b.alpha.fill_(-0.25)
    a.frozen[2] = True
    eps = 1e-3
    expected = np.sqrt(np.abs(1 - np.array([0.0, 0.5, -0.25])) + eps).sum()
    assert slope_penalty([a, b], eps).item() == pytest.approx(expected, rel=1e-6)


def test_freeze_marks_reached_and_crossed_slopes():
    m = SlopeReLU(4)
    before = torch.tensor([0.5, 0.98, 1.2, 0.2])
    with torch.no_grad():
        m.alpha.copy_(torch.tensor([0.6, 0.995, 0.9, 0.3]))   # near 1; crossed 1 (1.2 → 0.9); neither
    assert m.freeze(before) == 2
    assert m.frozen.tolist() == [False, True, True, False]
    assert m.alpha.tolist()[1:3] == [1.0, 1.0]
    assert "frozen" in m.state_dict()


def test_freeze_rule_holds_over_training():
    torch.manual_seed(0)
    model = trained_like(Mixed())
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 1, 8, generator=gen), torch.randint(0, 4, (64,), generator=gen)
    swapped, _ = swap_relus(model, "channel", x[:2])
    slopes = [m for _, m in slope_modules(swapped)]
    seen = {"frozen": [m.frozen.clone() for m in slopes], "steps": 0}

    def check(step, loss):
        for i, m in enumerate(slopes):
            was = seen["frozen"][i]
            assert (m.frozen | ~was).all(), "a frozen slope was unfrozen"
            assert (m.alpha[m.frozen] == 1).all(), "a frozen slope moved away from 1"
            if m.alpha.grad is not None:
                assert (m.alpha.grad[was] == 0).all(), "a frozen slope received gradient"
            seen["frozen"][i] = m.frozen.clone()
        seen["steps"] += 1

    post_train(swapped, x, y, omega=0.5, epochs=6, slope_lr=0.2, batch_size=16, callback=check)
    assert seen["steps"] == 24
    frozen = torch.cat([m.frozen for m in slopes])
    assert frozen.any(), "strong pressure should freeze some slopes"
    alphas = torch.cat([m.alpha.detach() for m in slopes])
    assert ((alphas - 1).abs()[~frozen] >= 0.01).all()


def test_freeze_rule_resets_after_momentum():
    """Adam's momentum would move a frozen slope; the post-step reset puts it back at exactly 1."""
    m = SlopeReLU(2)
    opt = torch.optim.Adam([m.alpha], lr=0.4)
    x = -torch.ones(1, 2)
    with FreezeRule([m], opt):
        for _ in range(3):
            opt.zero_grad()
            m(x).sum().backward()        # y = α·x: Adam pushes α up by lr per step: 0.4, 0.8, 1.2
            assert not m.frozen.any() or (m.alpha == 1).all()
            opt.step()
        assert m.frozen.all() and (m.alpha == 1).all()
        opt.zero_grad()
        m(x).sum().backward()
        assert (m.alpha.grad == 0).all()
        opt.step()                       # Adam's momentum alone would move α
        assert (m.alpha == 1).all()


def test_no_relu_is_an_error():
    with pytest.raises(SimkitError, match="has no ReLU"):
        explicit_relus(nn.Sequential(nn.Linear(3, 3), nn.Tanh()))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        if x.sum() > 0:
            return torch.relu(self.fc(x))
        return self.fc(x)


def test_untraceable_control_flow_is_an_error():
    with pytest.raises(SimkitError, match="cannot trace Branchy with torch.fx.*torch.where"):
        explicit_relus(Branchy())


def test_data_without_labels_is_an_error():
    data = Dataset(torch.randn(20, 1, 8), None, "synthetic:1x8")
    with pytest.raises(SimkitError, match="has no labels"):
        linearize(Mixed(), data, LinearizeSettings(epochs=1), progress=False)


def test_fold_is_exact_for_linear_stretches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU(),
                          nn.Conv1d(4, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(18, 6), nn.ReLU(),
                          nn.Linear(6, 2))
    trained_like(model)
    x = torch.randn(5, 2, 8)
    swapped, _ = swap_relus(model, "channel", x)
    slopes = [m for _, m in slope_modules(swapped)]
    slopes[0].frozen.fill_(True)     # conv→BN→(linear)→conv folds into one conv
    slopes[2].frozen.fill_(True)     # linear→(linear)→linear folds into one linear
    with torch.no_grad():
        slopes[1].alpha.fill_(0.3)
    folded = fold_linear_stretches(swapped.double())
    assert (folded.depth_before, folded.depth_after) == (4, 2)
    assert folded.folds == 5          # two identities, BN, conv∘conv, linear∘linear
    xd = x.double()
    np.testing.assert_allclose(folded.model(xd).detach().numpy(), swapped.eval()(xd).detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    params = sum(p.numel() for p in folded.model.parameters())
    assert folded.params_after == params < folded.params_before


def test_fold_keeps_padded_conv_pairs():
    model = nn.Sequential(nn.Conv1d(1, 2, 3, padding=1), nn.ReLU(), nn.Conv1d(2, 2, 3, padding=1))
    swapped, _ = swap_relus(model, "layer", torch.randn(1, 1, 6))
    next(m for _, m in slope_modules(swapped)).frozen.fill_(True)
    folded = fold_linear_stretches(swapped)
    assert folded.depth_after == 2
    x = torch.randn(3, 1, 6)
    torch.testing.assert_close(folded.model(x), swapped(x))


def test_runner_tables_and_resume(tmp_path):
    gen = torch.Generator().manual_seed(0)
    data = Dataset(torch.randn(80, 1, 8, generator=gen), torch.randint(0, 4, (80,), generator=gen), "toy")

    def model() -> nn.Module:
        torch.manual_seed(0)
        return Mixed().train()

    settings = LinearizeSettings(omega=[1e-2, 1.0], epochs=2, batch_size=32, slope_lr=0.4, fold=True, train=1)
    kwargs = dict(progress=False, run_dir=tmp_path)
    net = model()
    result = linearize(net, data, settings, **kwargs)
    assert all(m.training for m in net.modules())                   # modes restored
    runs = result.tables["runs"]
    assert list(runs.columns[:5]) == ["granularity", "omega", "napl", "nonlinear_fraction", "accuracy"]
    assert len(runs) == 4 and runs["bit_exact_at_start"].all()
    assert set(result.summary) >= {"original_accuracy", "original_napl", "runs"}
    assert result.summary["original_napl"] == pytest.approx(4.5)    # 1 + (½·0 + ½·1) + 1 + 1 + 1
    layers = result.tables["layers"]
    assert len(layers) == 4 * 5 and layers["nonlinear_fraction"].between(0, 1).all()
    assert (runs["nonlinear_fraction"] < 1).any() and (runs["napl"] < 4.5).any()
    assert layers.groupby("run")["channels"].apply(list).map(tuple).nunique() == 1   # units, not slopes
    weighted = layers.assign(w=layers["nonlinear_fraction"] * layers["channels"]).groupby("run")[["w", "channels"]].sum()
    labels = [f"{g} ω={w:g}" for g, w in zip(runs["granularity"], runs["omega"], strict=True)]
    assert runs["nonlinear_fraction"].tolist() == pytest.approx((weighted["w"] / weighted["channels"])[labels].tolist())
    assert set(result.tables["cka"]["run"]) == set(layers["run"])
    assert result.meta["settings"] == settings.to_dict() and result.meta["data"] == "toy"
    result.meta["model"] = "<script>alert(1)</script>"
    from simkit.report import render_html

    html = render_html(result)
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "Accuracy against NAPL" in html and html.count("<svg") >= 3 and 'src="http' not in html
    again = linearize(model(), data, settings, resume=True, **kwargs)
    cols = ["napl", "nonlinear_fraction", "accuracy", "steps"]
    assert again.tables["runs"][cols].equals(runs[cols])


def test_resume_from_python_refuses_other_inputs_and_leaves_the_run(tmp_path):
    """A Python caller's run directory is tied to the settings and to the model and data as given."""
    gen = torch.Generator().manual_seed(0)
    data = Dataset(torch.randn(40, 1, 8, generator=gen), torch.randint(0, 4, (40,), generator=gen), "toy")
    settings = LinearizeSettings(granularity=["layer"], omega=[1e-2], epochs=1, batch_size=32, cka=False)

    def net(seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return trained_like(Mixed())

    kwargs = dict(run_dir=tmp_path, progress=False)
    first = linearize(net(), data, settings, **kwargs)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    other = LinearizeSettings(granularity=["layer"], omega=[1e-1], epochs=1, batch_size=32, cka=False)
    with pytest.raises(SimkitError, match=r"`resume`: .* other inputs \(omega: \[0.01\] → \[0.1\]\)"):
        linearize(net(), data, other, resume=True, **kwargs)
    with pytest.raises(SimkitError, match=r"other inputs \(data: "):
        linearize(net(), Dataset(data.inputs + 1, data.labels, "toy"), settings, resume=True, **kwargs)
    with pytest.raises(SimkitError, match=r"other inputs \(model: "):
        linearize(net(1), data, settings, resume=True, **kwargs)
    with pytest.raises(SimkitError, match="`batch_size` must be a positive integer"):   # checked before writing
        linearize(net(), data, LinearizeSettings(batch_size=0), **kwargs)
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before
    again = linearize(net(), data, settings, resume=True, **kwargs)   # the same inputs resume
    assert again.tables["runs"][["napl", "accuracy", "final_loss"]].equals(first.tables["runs"][["napl", "accuracy", "final_loss"]])


def test_matched_napl_interpolates_channel_accuracy():
    import pandas as pd

    from simkit.linearization.runner import matched_napl

    runs = pd.DataFrame({"granularity": ["channel", "channel", "layer", "layer"], "omega": [1, 2, 1, 2],
                         "napl": [1.0, 3.0, 2.5, 0.5], "accuracy": [0.6, 0.9, 0.7, 0.4]})
    matched = matched_napl(runs)
    assert list(matched["napl"]) == [0.5, 2.5]
    # 0.5 is below the channel range: nearest (napl 1 → 0.6); 2.5 interpolates 0.6 + 0.75·0.3 = 0.825
    assert list(matched["how"]) == ["nearest", "interpolated"]
    assert matched["channel_accuracy"].tolist() == pytest.approx([0.6, 0.825])
    assert matched["difference"].tolist() == pytest.approx([0.2, 0.125])


@given(st.floats(0, 1e300, allow_nan=False), st.floats(0, 1e300, allow_nan=False))
def test_omega_text_names_exactly_one_float(a, b):
    from simkit.linearization.runner import omega_text

    assert float(omega_text(a)) == a and "+" not in omega_text(a)
    assert (omega_text(a) == omega_text(b)) == (a == b)


def test_omegas_equal_to_six_digits_get_their_own_runs_and_checkpoints(tmp_path):
    from simkit.linearization.runner import omega_text, run_label

    assert [omega_text(w) for w in (1e-3, 1.0, 1e-20, 1.0000001e-4, -0.0)] == [
        "0.001", "1", "1e-20", "0.00010000001", "0"]
    assert run_label("channel", 1e-3) == "channel ω=0.001"      # ordinary values stay readable
    gen = torch.Generator().manual_seed(0)
    data = Dataset(torch.randn(40, 1, 8, generator=gen), torch.randint(0, 4, (40,), generator=gen), "toy")
    settings = LinearizeSettings(granularity=["layer"], omega=[1e-4, 1.0000001e-4, 1e-4], epochs=1, batch_size=32,
                                 cka=False)
    kwargs = dict(progress=False, run_dir=tmp_path)
    first = linearize(trained_like(Mixed()), data, settings, **kwargs)
    # a resume must find each ω's own checkpoint, not one that %g-spelling would share between them
    result = linearize(trained_like(Mixed()), data, settings, resume=True, **kwargs)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("linearize_*.pt"))
    assert names == ["linearize_layer_w0.0001.pt", "linearize_layer_w0.00010000001.pt"]
    assert result.tables["runs"]["omega"].tolist() == [1e-4, 1.0000001e-4]   # the repeated ω runs once
    assert result.tables["layers"]["run"].unique().tolist() == ["layer ω=0.0001", "layer ω=0.00010000001"]
    cols = ["napl", "nonlinear_fraction", "accuracy", "steps", "final_loss"]
    assert result.tables["runs"][cols].equals(first.tables["runs"][cols])
    # a second ω that %g spells like the first is another input: resuming into it is refused
    with pytest.raises(SimkitError, match="omega: "):
        linearize(trained_like(Mixed()), data, LinearizeSettings(granularity=["layer"], omega=[1e-4], epochs=1,
                                                                 batch_size=32, cka=False), resume=True, **kwargs)
