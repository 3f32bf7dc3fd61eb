"""Stitching: least-squares init, objectives against float64 numpy references, cutting models, IRIs,
the runner's two arms, and bad input."""

from __future__ import annotations

import copy
import re

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from torch import nn

from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.options import declarations, default_of
from simkit.settings.stitch import OBJECTIVES, IRISettings, StitchSettings
from simkit.stitching import iri as iri_mod
from simkit.stitching import runner as runner_mod
from simkit.stitching.halves import BackHalf, FrontHalf, record
from simkit.stitching.iri import generate_iris, relative_error, seed_indices
from simkit.stitching.objectives import DESCRIPTIONS, dm_loss, fula_loss, hlm_loss, slm_loss
from simkit.stitching.pairs import layer_pairs, match_depths
from simkit.stitching.runner import stitch
from simkit.stitching.stitch_layer import LeastSquares, StitchLayer, check_bridgeable, infer_layout
from simkit.stitching.stitched import StitchedModel, StitchLoss

# ------------------------------------------------------------------------------------------ fixtures


def tiny_cnn(seed: int, width: int = 4) -> nn.Sequential:
    """(b, 1, 6, 6) → logits (b, 3); names 0 conv, 1 relu, 2 conv, 3 relu, 4 flatten, 5 linear."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(width * 36, 3)).eval()


def tiny_data(n: int = 90, labels: bool = True) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n + 30, 1, 6, 6, generator=g)
    y = (x[:, 0, :3].sum((1, 2)) > x[:, 0, 3:].sum((1, 2))).long() + (x[:, 0, 0, 0] > 0.7).long()
    info = {"num_classes": 3, "input_shape": (1, 6, 6), "value_range": (0.0, 1.0)}
    test = Dataset(x[n:], y[n:] if labels else None, "tiny", info=info)
    return Dataset(x[:n], y[:n] if labels else None, "tiny", test=test, info=info)


def stitch_with(a: nn.Module, b: nn.Module, data: Dataset, *, run_dir=None, resume=False, cache_dir=None,
                  progress=False, **options):
    """``stitch`` with the settings given as keyword arguments."""
    return stitch(a, b, data, StitchSettings(**options), run_dir=run_dir, resume=resume, cache_dir=cache_dir,
                  progress=progress)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------ least squares / layers


@settings(max_examples=20, deadline=None)
@given(p=st.integers(1, 6), q=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_least_squares_recovers_exact_affine_relation(p, q, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(40, p))
    w, c = rng.normal(size=(q, p)), rng.normal(size=q)
    y = x @ w.T + c
    fitted = LeastSquares().fit([(torch.from_numpy(x[:15]), torch.from_numpy(y[:15])),
                                 (torch.from_numpy(x[15:]), torch.from_numpy(y[15:]))])
    np.testing.assert_allclose(fitted.coef_.numpy(), w, atol=1e-8)
    np.testing.assert_allclose(fitted.intercept_.numpy(), c, atol=1e-8)
    assert fitted.residual_ < 1e-12
    assert fitted.n_rows_ == 40


def test_least_squares_matches_numpy_on_noisy_data():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(60, 4)), rng.normal(size=(60, 3))
    fitted = LeastSquares().fit(torch.from_numpy(x), torch.from_numpy(y))
    design = np.hstack([x, np.ones((60, 1))])
    ref, *_ = np.linalg.lstsq(design, y, rcond=None)
    np.testing.assert_allclose(fitted.coef_.numpy(), ref[:4].T, atol=1e-9)
    np.testing.assert_allclose(fitted.intercept_.numpy(), ref[4], atol=1e-9)
    rss = ((design @ ref - y) ** 2).sum() / 60
    assert fitted.residual_ == pytest.approx(rss, rel=1e-9)
    assert LeastSquares(ridge=0.5).fit(torch.from_numpy(x), torch.from_numpy(y)) is not fitted


def test_dm_init_recovers_exact_linear_relation_between_two_layers():
    """B's layer '2' is a 1×1 conv of A's layer '1' (B's first conv is A's): the DM fit finds it."""
    a = tiny_cnn(0)
    mix = nn.Conv2d(4, 5, 1)
    b = nn.Sequential(copy.deepcopy(a[0]), nn.ReLU(), mix, nn.ReLU(), nn.Flatten(), nn.Linear(5 * 36, 3)).eval()
    x = torch.rand(64, 1, 6, 6, generator=torch.Generator().manual_seed(3))
    front = FrontHalf(a, "1")
    with torch.no_grad(), record(b, ["2"]) as acts:
        b(x)
        h_a = front(x)
    stitch = StitchLayer(tuple(h_a.shape[1:]), tuple(acts["2"].shape[1:]), "map2d")
    assert stitch.fit([(h_a[:30], acts["2"][:30]), (h_a[30:], acts["2"][30:])]) is stitch
    np.testing.assert_allclose(stitch.map.weight.detach().reshape(5, 4).numpy(),
                               mix.weight.detach().reshape(5, 4).numpy(), atol=1e-4)
    np.testing.assert_allclose(stitch.map.bias.detach().numpy(), mix.bias.detach().numpy(), atol=1e-4)
    assert stitch.dm_residual_ < 1e-8
    with torch.no_grad():
        assert dm_loss(stitch(h_a), acts["2"]) < 1e-8


def test_stitch_layer_resizes_feature_maps_and_maps_tokens():
    conv = StitchLayer((4, 6, 6), (3, 3, 3), "map2d")
    assert conv(torch.randn(2, 4, 6, 6)).shape == (2, 3, 3, 3)
    conv1d = StitchLayer((4, 10), (2, 20), "map1d")
    assert conv1d(torch.randn(2, 4, 10)).shape == (2, 2, 20)
    tokens = StitchLayer((7, 8), (7, 5), "tokens")
    assert tokens(torch.randn(2, 7, 8)).shape == (2, 7, 5)
    identity = StitchLayer((4, 5, 5), (4, 5, 5), "map2d")
    h = torch.randn(3, 4, 5, 5)
    torch.testing.assert_close(identity(h), h)


def test_layouts_that_no_stitch_bridges():
    assert infer_layout((5,)) == "vector" and infer_layout((3, 4)) == "map1d"
    assert infer_layout((3, 4), tokens=True) == "tokens" and infer_layout((3, 4, 4)) == "map2d"
    with pytest.raises(SimkitError, match="no stitch bridges A's map2d activations"):
        check_bridgeable((4, 6, 6), (144,), "map2d", "vector")
    with pytest.raises(SimkitError, match="no stitch bridges 7 tokens of A and 5 tokens of B"):
        check_bridgeable((7, 8), (5, 8), "tokens", "tokens")
    with pytest.raises(SimkitError, match="cannot stitch activations of shape"):
        infer_layout((1, 2, 3, 4))


# ---------------------------------------------------------------------------------------- objectives


def test_objectives_match_numpy_references():
    rng = np.random.default_rng(0)
    logits, target = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    labels = rng.integers(0, 4, size=5)

    def log_softmax(z):
        z = z - z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))

    ce = -log_softmax(logits)[np.arange(5), labels].mean()
    assert float(hlm_loss(torch.from_numpy(logits), torch.from_numpy(labels))) == pytest.approx(ce, rel=1e-10)
    p_b, log_s = np.exp(log_softmax(target)), log_softmax(logits)
    kl = (p_b * (np.log(p_b) - log_s)).sum(1).mean()
    assert float(slm_loss(torch.from_numpy(logits), torch.from_numpy(target))) == pytest.approx(kl, rel=1e-10)

    hs = [rng.normal(size=(5, 3, 2)), rng.normal(size=(5, 7))]
    ts = [rng.normal(size=(5, 3, 2)), rng.normal(size=(5, 7))]
    dm = ((hs[0] - ts[0]) ** 2).reshape(5, -1).sum(1).mean()
    assert float(dm_loss(torch.from_numpy(hs[0]), torch.from_numpy(ts[0]))) == pytest.approx(dm, rel=1e-10)
    fula = np.mean([(((h - t) ** 2).reshape(5, -1).sum(1) / ((t ** 2).reshape(5, -1).sum(1) + 1e-8)).mean()
                    for h, t in zip(hs, ts, strict=True)])
    got = fula_loss([torch.from_numpy(h) for h in hs], [torch.from_numpy(t) for t in ts])
    assert float(got) == pytest.approx(fula, rel=1e-10)


def test_objectives_are_parsed_by_the_settings_and_each_has_a_description():
    settings = StitchSettings(layer_a="1", layer_b="1", objective="dm, fula,dm")
    assert settings.objectives == ["dm", "fula"] and settings.validate().objective == ["dm", "fula"]
    with pytest.raises(SimkitError, match="unknown objective 'kl'"):
        StitchSettings(layer_a="1", layer_b="1", objective="kl").validate()
    with pytest.raises(SimkitError, match="`objective` is empty"):
        StitchSettings(layer_a="1", layer_b="1", objective=[]).validate()
    assert tuple(DESCRIPTIONS) == OBJECTIVES


# ------------------------------------------------------------------------------------------- halves


CALLS = {"n": 0}


def count_calls(module, inputs, output):
    """Forward hook counting calls (deep copies keep the hook, so copies count too)."""
    CALLS["n"] += 1


def test_back_half_is_a_real_cut_and_front_half_stops_early():
    model = tiny_cnn(0)
    model[0].register_forward_hook(count_calls)
    model[5].register_forward_hook(count_calls)
    x = torch.rand(4, 1, 6, 6)
    back, front = BackHalf(model, "2"), FrontHalf(model, "1")
    assert back.mode == "cut"
    assert back.later_layers == ["3", "5"]
    with torch.no_grad():
        h = front(x)
        CALLS["n"] = 0
        out = back(model[2](h))
    assert CALLS["n"] == 1  # only the head ran, not the first conv
    torch.testing.assert_close(out, model(x))
    CALLS["n"] = 0
    with torch.no_grad():
        front(x)
    assert CALLS["n"] == 1  # the first conv ran, the head did not


class SkipOver(nn.Module):
    """out = head(x_flat + f(x)): the skip bypasses ``f``, so B cannot be cut at ``f``."""

    def __init__(self):
        super().__init__()
        self.f = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(x + self.f(x))


def test_back_half_falls_back_to_output_replacement_loudly():
    model = SkipOver().eval()
    with pytest.warns(UserWarning, match="output replacement"):
        back = BackHalf(model, "f")
    assert back.mode == "replace" and "skip connection" in back.reason
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(back(model.f(x), x), model(x))
    with pytest.raises(SimkitError, match="cannot cut model B at 'f'"):
        BackHalf(model, "f", allow_replace=False)


def test_identity_stitch_between_identical_models_has_zero_fula_loss_and_b_accuracy():
    model, data = tiny_cnn(0), tiny_data()
    front, back = FrontHalf(model, "1"), BackHalf(model, "1")
    stitch = StitchLayer((4, 6, 6), (4, 6, 6), "map2d")
    stitched = StitchedModel(front, stitch, back)
    x = data.inputs
    assert StitchLoss("fula", stitched)((x, data.labels)).item() == 0.0
    assert StitchLoss("dm", stitched)((x, data.labels)).item() == 0.0
    result = stitch_with(model, model, data, layer_a="1", layer_b="1", objective="fula", steps=0,
                           init="default", cache_dir=None, progress=False)
    row = result.to_frame().iloc[0]
    assert row.stitched_accuracy == row.b_accuracy == result.summary["b_accuracy"]
    assert row.penalty == 0.0


# ----------------------------------------------------------------------------------------------- IRIs


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 50), seed=st.integers(0, 1000))
def test_seed_indices_never_pick_the_input_itself(n, seed):
    idx = seed_indices(n, torch.Generator().manual_seed(seed))
    assert sorted(idx.tolist()) == list(range(n))
    assert not (idx == torch.arange(n)).any()


def _numpy_relative_error(front, x_prime, x) -> np.ndarray:
    with torch.no_grad():
        a1 = front(x_prime).double().flatten(1).numpy()
        a0 = front(x).double().flatten(1).numpy()
    return np.linalg.norm(a1 - a0, axis=1) / np.linalg.norm(a0, axis=1)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_iris_reach_tolerance_and_report_their_true_error(optimizer, tmp_path):
    model = tiny_cnn(0)
    front = FrontHalf(model, "1")
    x = tiny_data(40).inputs
    iri_settings = IRISettings(steps=400, tol=0.05, optimizer=optimizer, lr=0.02, batch_size=16)
    iris, info = generate_iris(front, x, iri_settings, value_range=(0.0, 1.0), seed=0, progress=False,
                               cache_dir=tmp_path, key_parts={"model": "m", "layer": "1", "data": "d"})
    assert info["cache"] == "miss"
    assert bool(iris.reached.all()), iris.rel_error.max()
    np.testing.assert_allclose(iris.rel_error.numpy(), _numpy_relative_error(front, iris.iris, x), atol=1e-5)
    assert iris.iris.min() >= 0.0 and iris.iris.max() <= 1.0
    start_error = _numpy_relative_error(front, x[iris.seed_index], x)
    assert (iris.rel_error.numpy() <= start_error + 1e-6).all()
    assert not torch.equal(iris.iris, x)


class Interrupted(Exception):
    """Stands in for a run killed between two IRI batches."""


def test_iri_cache_hits_and_resumes_a_partial_run(tmp_path, monkeypatch):
    front = FrontHalf(tiny_cnn(0), "1")
    x = tiny_data(30).inputs
    s = IRISettings(steps=30, tol=0.0, seed="noise", batch_size=10)
    keys = {"model": "m", "layer": "1", "data": "d"}
    whole, _ = generate_iris(front, x, s, value_range=(0.0, 1.0), progress=False)

    real, calls, stop_at = iri_mod.optimise_batch, [], [2]

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == stop_at[0]:
            raise Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(iri_mod, "optimise_batch", interrupted)
    with pytest.raises(Interrupted):
        generate_iris(front, x, s, value_range=(0.0, 1.0), cache_dir=tmp_path, key_parts=keys, progress=False)
    assert len(list(tmp_path.glob("*.partial.safetensors"))) == 1
    calls.clear()
    stop_at[0] = 0
    resumed, info = generate_iris(front, x, s, value_range=(0.0, 1.0), cache_dir=tmp_path, key_parts=keys,
                                  progress=False)
    assert len(calls) == 2 and info["cache"] == "miss"  # only the two missing batches ran
    torch.testing.assert_close(resumed.iris, whole.iris)
    torch.testing.assert_close(resumed.rel_error, whole.rel_error)
    assert not list(tmp_path.glob("*.partial.safetensors"))
    calls.clear()
    again, info = generate_iris(front, x, s, value_range=(0.0, 1.0), cache_dir=tmp_path, key_parts=keys,
                                progress=False)
    assert info["cache"] == "hit" and not calls
    torch.testing.assert_close(again.iris, whole.iris)
    _, info = generate_iris(front, x, IRISettings(steps=31, tol=0.0, seed="noise", batch_size=10),
                            value_range=(0.0, 1.0), cache_dir=tmp_path, key_parts=keys, progress=False)
    assert info["cache"] == "miss"


def test_relative_error_is_scale_free():
    front = FrontHalf(tiny_cnn(0), "0")
    x = torch.rand(3, 1, 6, 6)
    assert torch.allclose(relative_error(front, x, front(x)), torch.zeros(3))


# -------------------------------------------------------------------------------------------- runner


def test_iri_arm_trains_on_iris_only_and_models_stay_unchanged(monkeypatch, tmp_path):
    """Every input B or A sees while a stitch is initialised or trained is an IRI, never a clean input."""
    data = tiny_data()
    a, b = tiny_cnn(0), tiny_cnn(1)
    seen: list[torch.Tensor] = []
    phase = {"training": None}

    def spy(module, inputs):
        if phase["training"] == "iri":
            seen.append(inputs[0].detach().clone())

    real_fit, real_lstsq = runner_mod._fit, runner_mod._lstsq_state

    def fit(stitch, loss, data_t, config, run_dir, name, resume):
        phase["training"] = name.rsplit("__", 1)[-1]
        inputs = data_t[0]
        try:
            for mod in (loss.model.front.model, loss.model.back.model):
                mod.register_forward_pre_hook(spy)
            return real_fit(stitch, loss, data_t, config, run_dir, name, resume)
        finally:
            phase["training"] = None
            fit.inputs[name] = inputs

    fit.inputs = {}

    def lstsq(front, back, stitch, x, batch_size, device):
        phase["training"] = "iri" if not torch.equal(x, data.inputs) else "standard"
        try:
            for mod in (front.model, back.model):
                mod.register_forward_pre_hook(spy)
            return real_lstsq(front, back, stitch, x, batch_size, device)
        finally:
            phase["training"] = None

    monkeypatch.setattr(runner_mod, "_fit", fit)
    monkeypatch.setattr(runner_mod, "_lstsq_state", lstsq)
    before_a, before_b = state(a), state(b)
    modes = [m.training for m in b.modules()]
    result = stitch_with(a, b, data, layer_a="1", layer_b="1", objective="hlm,fula", iri=True, steps=3,
                           batch_size=16, iri_steps=50, iri_tol=0.05, cache_dir=tmp_path,
                           progress=False)
    iris = load_file(str(next(tmp_path.glob("iri-*.safetensors"))))["iris"]
    assert torch.equal(fit.inputs["stitch_1__1__fula__iri"], iris)
    assert torch.equal(fit.inputs["stitch_1__1__hlm__standard"], data.inputs)
    assert seen, "the spy saw no forward pass of the IRI arm"
    clean = data.inputs.flatten(1)
    iri_rows = iris.flatten(1)
    for batch in seen:
        rows = batch.flatten(1)
        assert (rows[:, None] == iri_rows[None]).all(-1).any(1).all()  # each row is an IRI
        assert not (rows[:, None] == clean[None]).all(-1).any()  # and no row is a clean input
    for got, want in ((state(a), before_a), (state(b), before_b)):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    assert all(p.grad is None and p.requires_grad for p in list(a.parameters()) + list(b.parameters()))
    assert [m.training for m in b.modules()] == modes
    table = result.to_frame()
    assert list(table.columns) == ["layer_a", "layer_b", "objective", "setting", "stitched_accuracy",
                                   "b_accuracy", "penalty", "seed", "a_accuracy", "penalty_min", "chosen_step"]
    assert sorted(set(zip(table.objective, table.setting, strict=True))) == [
        ("fula", "iri"), ("fula", "standard"), ("hlm", "iri"), ("hlm", "standard")]
    np.testing.assert_allclose(table.penalty, table.b_accuracy - table.stitched_accuracy)
    errors = load_file(str(next(tmp_path.glob("iri-*.safetensors"))))["rel_error"]
    assert result.summary["iri_relative_error_median"] == pytest.approx(float(errors.median()))
    assert result.summary["mean_penalty_fula_iri"] == pytest.approx(
        float(table[(table.objective == "fula") & (table.setting == "iri")].penalty.mean()))


def test_runner_errors_name_the_problem():
    a, b, data = tiny_cnn(0), tiny_cnn(1), tiny_data()
    with pytest.raises(SimkitError, match="unknown layer of model A 'conv9'"):
        stitch_with(a, b, data, layer_a="conv9", layer_b="1", progress=False, cache_dir=None)
    with pytest.raises(SimkitError, match="unknown layer of model B 'nope'"):
        stitch_with(a, b, data, layer_a="1", layer_b="nope", progress=False, cache_dir=None)
    with pytest.raises(SimkitError, match="no stitch bridges A's map2d activations .* and B's vector"):
        stitch_with(a, b, data, layer_a="1", layer_b="4", progress=False, cache_dir=None)
    with pytest.raises(SimkitError, match="the HLM objective needs labels but data 'tiny' has none"):
        stitch_with(a, b, tiny_data(labels=False), layer_a="1", layer_b="1", objective="hlm",
                      progress=False, cache_dir=None)
    with pytest.raises(SimkitError, match="`layer_a` has 2 names and `layer_b` 3"):
        stitch_with(a, b, data, layer_a="1,3", layer_b="1,2,3", progress=False, cache_dir=None)
    with pytest.raises(SimkitError, match="say where to stitch"):
        stitch_with(a, b, data, progress=False, cache_dir=None)


def test_layer_pairs_and_depth_matching():
    a, b = tiny_cnn(0), tiny_cnn(1)
    assert layer_pairs(a, b, "1,3", "1") == [("1", "1"), ("3", "1")]
    assert match_depths(["a1", "a2", "a3"], ["b1", "b2", "b3", "b4", "b5", "b6"]) == [
        ("a1", "b2"), ("a2", "b4"), ("a3", "b6")]
    assert match_depths(["a1", "a2"], ["b1"]) == [("a1", "b1"), ("a2", "b1")]
    with pytest.raises(SimkitError, match="either `layers` auto or `layer_a`/`layer_b`"):
        layer_pairs(a, b, "1", "1", layers="auto")


def test_resume_restores_finished_stitches_without_training(tmp_path, monkeypatch):
    a, b, data = tiny_cnn(0), tiny_cnn(1), tiny_data()
    kwargs = dict(layer_a="1", layer_b="3", objective="slm", steps=5, batch_size=16, progress=False,
                  cache_dir=None, run_dir=tmp_path)
    first = stitch_with(a, b, data, **kwargs)
    assert (tmp_path / "checkpoints" / "stitch_1__3__slm__standard.pt").is_file()
    second = stitch_with(a, b, data, resume=True, **kwargs)
    assert first.to_frame().equals(second.to_frame())
    assert first.tables["training"].final_loss.tolist() == second.tables["training"].final_loss.tolist()


# -------------------------------------------------------------------------------------------- report


def test_report_renders_hand_made_result_and_escapes_names():
    import pandas as pd

    from simkit.report import render_html
    from simkit.report.stitch import penalty_frames
    from simkit.stitching.runner import StitchResult

    rows = [{"layer_a": la, "layer_b": "<b>evil</b>", "objective": obj, "setting": setting,
             "stitched_accuracy": 0.5, "b_accuracy": 0.9, "penalty": pen}
            for la, pen in (("l1", 0.1), ("l2", 0.4)) for obj in ("dm", "fula")
            for setting in ("standard", "iri")]
    result = StitchResult(
        summary={"a_accuracy": 0.9, "b_accuracy": 0.9, "iri_relative_error_median": 0.04},
        tables={"stitching": pd.DataFrame(rows)},
        meta={"model_a": "<script>alert(1)</script>", "model_b": "b", "iri": {"tol": 0.05}},
        extra={"iri_histograms": {"l1": {"log10_edges": [-3, -2, -1], "counts": [3, 5]}},
               "iri_examples": {"l1": {"original": [[[0.0, 1.0]]], "iri": [[[0.1, 0.9]]], "seed": [None],
                                       "rel_error": [0.03], "shape": [1, 2]}}})
    frames = penalty_frames(result.tables["stitching"])
    assert list(frames) == ["standard", "iri"]
    assert frames["iri"].loc["fula"].tolist() == pytest.approx([10.0, 40.0])  # points
    html = render_html(result)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert "<b>evil</b>" not in html
    assert html.count("<svg") >= 2 and "IRIs beside their originals at l1" in html


def test_runner_in_output_replacement_mode_records_it():
    torch.manual_seed(0)
    model = SkipOver().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(60, 6, generator=g)
    y = (x[:, 0] > 0.5).long()
    info = {"value_range": (0.0, 1.0)}
    data = Dataset(x[:40], y[:40], "vec", test=Dataset(x[40:], y[40:], "vec", info=info), info=info)
    with pytest.warns(UserWarning, match="output replacement"):
        result = stitch_with(model, model, data, layer_a="f", layer_b="f", objective="fula,slm", steps=0,
                               init="default", cache_dir=None, progress=False)
    assert result.meta["cut"]["f->f"].startswith("replace (a path from the input")
    assert (result.to_frame().penalty == 0).all()


# ------------------------------------------------------------------------------- modes, settings, run dir


def bn_cnn(seed: int) -> nn.Sequential:
    """tiny_cnn with BatchNorm after each conv, running statistics away from their init (eval mode)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                          nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3))
    with torch.no_grad():
        model.train()
        model(2 * torch.rand(64, 1, 6, 6, generator=torch.Generator().manual_seed(seed)))
    return model.eval()


def test_results_of_an_objective_do_not_depend_on_the_objectives_before_it():
    """Evaluating a stitch must not leave the shared frozen B (its BatchNorm) in training mode."""
    a, b, data = bn_cnn(0), bn_cnn(1), tiny_data()
    options = dict(layer_a="2", layer_b="2", steps=5, batch_size=16)
    alone = stitch_with(a, b, data, objective="slm", **options)
    after = stitch_with(a, b, data, objective="hlm,slm", **options)
    for name in ("stitching", "training"):
        table = after.tables[name]
        pd.testing.assert_frame_equal(alone.tables[name], table[table.objective == "slm"].reset_index(drop=True))


def test_frozen_halves_stay_in_eval_mode():
    model = bn_cnn(0)
    front, back = FrontHalf(model, "2"), BackHalf(model, "2")
    stitched = StitchedModel(front, StitchLayer((4, 6, 6), (4, 6, 6), "map2d"), back)
    stitched.train()
    assert stitched.stitch.training
    assert not any(m.training for half in (front.model, back.model, back.module) for m in half.modules())


def test_settings_validate_names_the_field():
    for options, message in ((dict(batch_size=0), "`batch_size` must be a positive integer, got 0"),
                             (dict(steps=-1), "`steps` must be 0 or a positive integer, got -1"),
                             (dict(init="zeros"), "`init` must be one of lstsq, default, got 'zeros'"),
                             (dict(iri_seed="x"), "`iri_seed` must be one of data, noise, got 'x'"),
                             (dict(iri_optimizer="lbfgs"), "`iri_optimizer` must be one of sgd, adam"),
                             (dict(iri_tol=-1), "`iri_tol` must be a number >= 0, got -1"),
                             (dict(n=0), "`n` must be a positive integer or None, got 0"),
                             (dict(layers="deep"), "`layers` must be one of auto or None, got 'deep'"),
                             (dict(layer_a=["1", 2]), "`layer_a` must be module names"),
                             (dict(objective="kl"), "unknown objective 'kl'")):
        with pytest.raises(SimkitError, match=re.escape(message)):
            StitchSettings(**{"layer_a": "1", "layer_b": "1", **options}).validate()
    settings = StitchSettings(layer_a="1", layer_b="1", iri_steps=7, iri_optimizer="adam")
    assert settings.iri_settings() == IRISettings(steps=7, optimizer="adam")
    assert settings.to_dict()["iri_steps"] == 7 and settings.to_dict()["objective"] == ["fula"]


def test_iri_options_are_the_iri_settings_declarations_with_the_prefix():
    stitch_fields = declarations(StitchSettings)
    for name, (f, decl) in declarations(IRISettings).items():
        prefixed, prefixed_decl = stitch_fields["iri_" + name]
        assert default_of(prefixed) == default_of(f)
        assert (prefixed_decl.constraint, prefixed_decl.help) == (decl.constraint, decl.help)
    assert StitchSettings().iri_settings() == IRISettings()


def test_runner_takes_modules_and_a_dataset_and_names_them():
    a, b, data = tiny_cnn(0), tiny_cnn(1), tiny_data()
    with pytest.raises(SimkitError, match="`model_a` must be a torch.nn.Module"):
        stitch("simkit:cnn2d", b, data, StitchSettings(layer_a="1", layer_b="1"))
    with pytest.raises(SimkitError, match="`data` must be a simkit Dataset"):
        stitch(a, b, "digits", StitchSettings(layer_a="1", layer_b="1"))  # type: ignore[arg-type]
    result = stitch(a, b, data, StitchSettings(layer_a="1", layer_b="1", objective="dm", steps=0),
                    cache_dir=None, progress=False, names=("front", "back"))
    assert (result.meta["model_a"], result.meta["model_b"]) == ("front", "back")
    assert result.meta["options"] == StitchSettings(layer_a="1", layer_b="1", objective="dm",
                                                    steps=0).validate().to_dict()


def test_resume_from_python_refuses_other_inputs_and_bad_input_leaves_the_run(tmp_path):
    a, b, data = tiny_cnn(0), tiny_cnn(1), tiny_data()
    options = dict(layer_a="1", layer_b="3", objective="dm", steps=2, batch_size=16, run_dir=tmp_path)
    stitch_with(a, b, data, **options)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert tmp_path / "inputs.json" in files and any(p.suffix == ".pt" for p in files)
    with pytest.raises(SimkitError, match="was made with other inputs .*steps: 2 → 3"):
        stitch_with(a, b, data, resume=True, **{**options, "steps": 3})
    with pytest.raises(SimkitError, match="was made with other inputs .*model_b"):
        stitch_with(a, tiny_cnn(2), data, resume=True, **options)
    with pytest.raises(SimkitError, match="unknown layer of model B 'nope'"):  # a fresh run, failing its checks
        stitch_with(a, b, data, **{**options, "layer_b": "nope"})
    with pytest.raises(SimkitError, match="`resume` needs `run_dir`"):
        stitch_with(a, b, data, resume=True, **{**options, "run_dir": None})
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    stitch_with(a, b, data, resume=True, **options)
