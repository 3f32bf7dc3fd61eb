"""The comparison engine against float64 numpy references, over every accepted data form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from simkit import SimkitError
from simkit.engine import compare
from simkit.report import save_run
from tests import reference


def tiny_models(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    a = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    b = nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 4)).double()
    return a, b


def manual_activations(model: nn.Sequential, x: torch.Tensor, names: list[str]) -> dict[str, np.ndarray]:
    out, h = {}, x
    with torch.no_grad():
        for name, module in model.named_children():
            h = module(h)
            if name in names:
                out[name] = h.numpy().copy()
    return out


@pytest.fixture
def data() -> torch.Tensor:
    return torch.randn(48, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def test_exact_mode_equals_reference_whatever_the_batch_size(data):
    a, b = tiny_models()
    layers_a, layers_b = ["1", "3", "4"], ["1", "2"]
    acts_a, acts_b = manual_activations(a, data, layers_a), manual_activations(b, data, layers_b)
    for batch_size in (5, 16, 48):
        result = compare(a, b, data, layers_a=layers_a, layers_b=layers_b, metrics=["linear_cka"],
                         mode="exact", batch_size=batch_size, progress=False)
        matrix = result.matrix("linear_cka")
        for la in layers_a:
            for lb in layers_b:
                assert matrix.loc[la, lb] == pytest.approx(reference.cka(acts_a[la], acts_b[lb], "linear_cka"), abs=1e-10)


@pytest.mark.parametrize("memory_budget_bytes, path", [(2**30, "features"), (1, "stored-gram")])
def test_exact_unbiased_cka_equals_full_data_reference_whatever_the_batch_size(data, memory_budget_bytes, path):
    a, b = tiny_models()
    acts_a, acts_b = manual_activations(a, data, ["1", "3"]), manual_activations(b, data, ["2"])
    for batch_size in (3, 7, 48):
        result = compare(a, b, data, layers_a=["1", "3"], layers_b=["2"], metrics=["unbiased_cka"], mode="exact",
                         batch_size=batch_size, memory_budget_bytes=memory_budget_bytes, progress=False)
        assert result.meta["method"]["unbiased_cka"]["path"] == path
        for la in ("1", "3"):
            k, l_ = acts_a[la] @ acts_a[la].T, acts_b["2"] @ acts_b["2"].T
            expected = reference.cka_of_grams(k, l_, reference.hsic_unbiased)
            assert result.matrix("unbiased_cka").loc[la, "2"] == pytest.approx(expected, abs=1e-10)


def test_minibatch_mode_equals_nguyen_reference(data):
    a, b = tiny_models()
    result = compare(a, b, data, layers_a=["1", "3"], layers_b=["2"], metrics=["unbiased_cka"],
                     mode="minibatch", batch_size=12, progress=False)
    acts_a, acts_b = manual_activations(a, data, ["1", "3"]), manual_activations(b, data, ["2"])
    for la in ("1", "3"):
        expected = reference.minibatch_cka(acts_a[la], acts_b["2"], "unbiased_cka", [12] * 4)  # 48 rows
        assert result.matrix("unbiased_cka").loc[la, "2"] == pytest.approx(expected, abs=1e-10)


def test_every_data_form_gives_the_same_numbers(data):
    from simkit.data import Dataset

    a, b = tiny_models()
    kwargs = dict(layers_a=["1", "3"], layers_b=["1"], metrics=["linear_cka", "unbiased_cka"],
                  mode="minibatch", batch_size=8, progress=False)
    expected = compare(a, b, data, **kwargs).to_frame()
    labels = torch.zeros(len(data), dtype=torch.long)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, labels), batch_size=5)
    dataset = Dataset(inputs=data, labels=labels, spec="test")
    for form in (loader, dataset, [(data[:20], labels[:20]), (data[20:], labels[20:])]):
        got = compare(a, b, form, **kwargs).to_frame()
        np.testing.assert_allclose(got["value"], expected["value"], rtol=0, atol=1e-12)


def test_n_caps_the_samples(data):
    a, b = tiny_models()
    result = compare(a, b, data, layers_a=["1"], layers_b=["1"], n=20, progress=False)
    assert result.summary["n"] == 20


def test_hooks_removed_and_modes_restored(data):
    a, b = tiny_models()
    a.train()
    b.eval()
    compare(a, b, data, layers_a=["1"], layers_b=["1"], progress=False)
    assert a.training and not b.training
    for model in (a, b):
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_a_model_against_itself_equals_a_copy(data):
    import copy

    a, _ = tiny_models()
    kwargs = dict(layers_a=["1", "3"], layers_b=["3", "4"], metrics=["linear_cka", "unbiased_cka"],
                  mode="exact", batch_size=10, progress=False)
    same = compare(a, a, data, **kwargs)
    copied = compare(a, copy.deepcopy(a), data, **kwargs)
    np.testing.assert_array_equal(same.to_frame()["value"], copied.to_frame()["value"])
    assert same.matrix("linear_cka").loc["3", "3"] == pytest.approx(1.0, abs=1e-12)
    assert list(same.tables["layers"]["name"]) == ["1", "3", "3", "4"]
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in a.modules())


def test_hooks_removed_after_an_error():
    a, b = tiny_models()
    bad = torch.full((8, 6), float("nan"), dtype=torch.float64)
    with pytest.raises(SimkitError, match="non-finite activations"):
        compare(a, b, bad, layers_a=["1"], layers_b=["1"], progress=False)
    assert all(not m._forward_hooks for m in a.modules())


def test_result_tables_and_summary(data):
    a, b = tiny_models()
    result = compare(a, b, data, layers_a=["1", "3"], layers_b=["1"], progress=False)
    frame = result.to_frame()
    # the defaults: unbiased_cka first, and a 10-permutation null (minibatch CKA: it costs ~1 % there)
    assert list(frame.columns) == ["layer_a", "layer_b", "metric", "value", "null_mean", "null_p95", "chance",
                                   "beats_chance"]
    np.testing.assert_array_equal(frame["chance"], frame["null_mean"])
    np.testing.assert_array_equal(frame["beats_chance"], frame["value"] > frame["null_p95"])
    assert result.summary["metrics"] == ["unbiased_cka", "linear_cka"] and result.meta["settings"]["null"] == {"unbiased_cka": 10, "linear_cka": 10}
    assert result.summary["model_a"] == "model_a"  # a module simkit did not load has no spec to name it by
    layers = result.tables["layers"]
    assert list(layers["name"]) == ["1", "3", "1"] and list(layers["dim"]) == [8, 5, 7]
    assert result.summary["n_layers_a"] == 2 and result.summary["mode"] == "minibatch"


@pytest.mark.parametrize("kwargs, permutations", [
    (dict(), {"unbiased_cka": 10, "linear_cka": 10}), (dict(metrics=["rbf_cka"]), {"rbf_cka": 10}),
    (dict(mode="exact"), {"unbiased_cka": 0, "linear_cka": 0}),  # a closed-form chance level instead
    (dict(metrics=["unbiased_cka", "mutual_knn"]), {"unbiased_cka": 10, "mutual_knn": 5}),  # a few draws
    (dict(null=0), {"unbiased_cka": 0, "linear_cka": 0}), (dict(mode="exact", null=3), {"unbiased_cka": 3,
                                                                                     "linear_cka": 3})])
def test_the_default_null_is_each_measures_chance_rule(data, kwargs, permutations):
    a, b = tiny_models()
    result = compare(a, b, data, layers_a=["1"], layers_b=["1"], progress=False, **{"knn_k": 3, **kwargs})
    assert result.meta["settings"]["null"] == permutations
    assert result.meta["settings_given"]["null"] == kwargs.get("null")
    assert ("null_p95" in result.to_frame().columns) == (max(permutations.values()) > 0)


def test_models_are_named_by_their_specs(data):
    from simkit.data import load_data
    from simkit.models import load_model

    a, b = load_model("simkit:mlp:in_features=40,hidden=8,depth=1"), load_model("simkit:cnn1d:channels=4,layers=2")
    result = compare(a, b, load_data("mnist1d", n=32), layers_a="blocks", layers_b="blocks", progress=False)
    assert (result.summary["model_a"], result.summary["model_b"], result.summary["data"]) == (
        "simkit:mlp:in_features=40,hidden=8,depth=1", "simkit:cnn1d:channels=4,layers=2", "mnist1d")
    named = compare(a, b, load_data("mnist1d", n=32), names=("mine", "theirs"), progress=False)
    assert (named.summary["model_a"], named.summary["model_b"]) == ("mine", "theirs")


def test_data_b_feeds_model_b_its_own_inputs(data):
    a, b = tiny_models()
    shifted = data * 2.0  # B reads the same samples in another form
    two = compare(a, b, data, layers_a=["1"], layers_b=["1"], data_b=shifted, progress=False, null=0)
    ref_b = b[:2](shifted).detach().numpy()
    ref_a = a[:2](data).detach().numpy()
    from simkit.metrics import linear_cka
    exact = compare(a, b, data, layers_a=["1"], layers_b=["1"], data_b=shifted, progress=False, mode="exact", null=0)
    assert exact.matrix("linear_cka").iloc[0, 0] == pytest.approx(
        float(linear_cka(torch.as_tensor(ref_a), torch.as_tensor(ref_b))), abs=1e-10)
    assert two.summary["n"] == len(data)
    with pytest.raises(SimkitError, match=r"`data_b` must hold the same samples as `data` \(48 rows\), got 47"):
        compare(a, b, data, data_b=shifted[:47], progress=False)


def test_null_columns_present(data):
    a, b = tiny_models()
    result = compare(a, b, data, layers_a=["1"], layers_b=["1"], null=5, progress=False)
    assert {"null_mean", "null_p95"} <= set(result.to_frame().columns)


def test_constant_layer_gives_nan_and_a_warning(data):
    a, _ = tiny_models()
    const = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 2)).double()
    with torch.no_grad():
        const[0].weight.zero_()
    with pytest.warns(RuntimeWarning, match="'0' \\(model_b\\)"):
        result = compare(a, const, data, layers_a=["1"], layers_b=["0"], metrics=["linear_cka"], progress=False)
    assert np.isnan(result.matrix("linear_cka").loc["1", "0"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(metrics=["cosine"]), "unknown metric 'cosine'"),
    (dict(mode="fast"), "`mode` must be one of exact, minibatch, got 'fast'"),
    (dict(n=3, metrics=["unbiased_cka"], mode="exact"), "at least 4 samples"),
    (dict(layers_a=["nope"]), "unknown layer"),
    (dict(null=-1), "`null` must be 0 or a positive integer or None, got -1; the number of permutations"),
    (dict(batch_size=0), "`batch_size` must be a positive integer"),
    (dict(rbf_factor=0.0, metrics=["rbf_cka"]), "`rbf_factor` must be a number > 0, got 0.0"),
    (dict(knn_k=0, metrics=["mutual_knn"]), "`knn_k` must be a positive integer"),
    (dict(device="gpu"), "unknown device 'gpu'"),
])
def test_bad_input_is_a_clear_error(data, kwargs, message):
    a, b = tiny_models()
    options = dict(layers_a=["1"], layers_b=["1"], progress=False) | kwargs
    with pytest.raises(SimkitError, match=message):
        compare(a, b, data, **options)


def test_save_and_load_round_trip(tmp_path, data):
    import simkit

    a, b = tiny_models()
    result = compare(a, b, data, layers_a=["1", "3"], layers_b=["1"], progress=False)
    save_run(result, tmp_path / "run")
    back = simkit.load(tmp_path / "run")
    assert back.kind == "compare"
    np.testing.assert_allclose(back.matrix("linear_cka").to_numpy(), result.matrix("linear_cka").to_numpy(),
                               rtol=1e-12)
    assert (tmp_path / "run" / "report.html").is_file()
    assert not list((tmp_path / "run").glob(".*.tmp"))


def test_a_reduction_error_is_not_blamed_on_the_data():
    conv = nn.Sequential(nn.Conv1d(1, 3, 3), nn.ReLU()).double()
    x = torch.randn(8, 1, 10, dtype=torch.float64)
    with pytest.raises(SimkitError, match="^reduction 'cls' needs a token sequence") as info:
        compare(conv, conv, x, layers_a=["0"], layers_b=["1"], reduce="cls", progress=False)
    assert "--data" not in str(info.value)


def test_spec_strings_are_refused_with_how_to_load_them(data):
    """The engine takes modules and data; spec strings are resolved by load_model/load_data (and the CLI)."""
    a, b = tiny_models()
    spec = "simkit:mlp:in_features=40,hidden=8,depth=2"
    with pytest.raises(SimkitError, match=r"`model_a` is a spec string .*simkit\.models\.load_model"):
        compare(spec, b, data, progress=False)
    with pytest.raises(SimkitError, match=r"`data` is a spec string .*simkit\.data\.load_data"):
        compare(a, b, "mnist1d", progress=False)
    with pytest.raises(SimkitError, match="`model_b` must be an nn.Module, got int"):
        compare(a, 3, data, progress=False)


def test_loaded_specs_record_names_data_and_seeds():
    from simkit.data import load_data
    from simkit.models import load_model

    spec_a, spec_b = "simkit:mlp:in_features=40,hidden=8,depth=2", "simkit:mlp:in_features=40,hidden=6,depth=1"
    dataset = load_data("mnist1d", n=24, seed=3)
    result = compare(load_model(spec_a, seed=3), load_model(spec_b, seed=4), dataset, n=24, seed=3,
                     metrics=["linear_cka"], names=(spec_a, spec_b), progress=False)
    assert result.summary["model_a"] == spec_a and result.summary["data"] == "mnist1d"  # the Dataset's spec
    assert result.meta["seeds"] == {"null": 3, "model_a": 3, "model_b": 4, "data": 3}  # data: load_data's seed


def test_every_option_is_recorded(data):
    a, b = tiny_models()
    result = compare(a, b, data, layers_a=["1"], layers_b="1,2", metrics=["linear_cka"], mode="exact",
                     batch_size=16, n=40, null=2, seed=5, rbf_factor=2.0, knn_k=4, memory_budget_bytes=1000,
                     progress=False)
    assert result.meta["settings"] == {
        "metrics": ["linear_cka"], "mode": "exact", "batch_size": 16, "n": 40, "null": {"linear_cka": 2}, "seed": 5,
        "rbf_factor": 2.0, "knn_k": 4, "memory_budget_bytes": 1000, "device": "cpu", "layers_a": ["1"],
        "layers_b": "1,2", "reduce": "auto", "output_index": None}
    assert result.meta["seeds"] == {"null": 5} and result.meta["world_size"] == 1
    assert result.meta["method"]["linear_cka"]["mode"] == "exact"
    assert set(result.meta["timings"]) == {"total", "forward", "metrics_final"}


def test_layer_names_that_look_like_numbers_survive_save_and_load(tmp_path):
    import simkit

    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(*[nn.Linear(4, 4) for _ in range(11)])).double()
    x = torch.randn(16, 4, dtype=torch.float64)
    result = compare(model, model, x, layers_a="0.1,0.10", layers_b="0.1,0.10", metrics=["linear_cka"],
                     progress=False)
    save_run(result, tmp_path / "run")
    back = simkit.load(tmp_path / "run")
    assert list(back.tables["layers"]["name"]) == ["0.1", "0.10", "0.1", "0.10"]
    pd_matrix = back.matrix("linear_cka")
    assert list(pd_matrix.index) == ["0.1", "0.10"]
    np.testing.assert_allclose(pd_matrix.to_numpy(), result.matrix("linear_cka").to_numpy(), rtol=1e-12)


def test_layer_names_that_look_missing_survive_save_and_load(tmp_path):
    """pandas reads "NA", "nan" and "None" as missing by default; layer names are text, never missing."""
    import simkit

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            for name in ("NA", "nan", "None"):
                self.add_module(name, nn.Linear(4, 4))

        def forward(self, x):
            for layer in self.children():
                x = layer(x)
            return x

    torch.manual_seed(0)
    model = Net().double()
    result = compare(model, model, torch.randn(16, 4, dtype=torch.float64), layers_a="NA,nan,None",
                     layers_b="NA,nan,None", metrics=["linear_cka"], progress=False)
    save_run(result, tmp_path / "run")
    back = simkit.load(tmp_path / "run")
    assert list(back.tables["layers"]["name"]) == ["NA", "nan", "None"] * 2
    assert list(back.matrix("linear_cka").index) == ["NA", "nan", "None"]
    np.testing.assert_allclose(back.matrix("linear_cka").to_numpy(), result.matrix("linear_cka").to_numpy(),
                               rtol=1e-12)


def test_progress_bar_writes_nothing_outside_a_terminal(capfd, data):
    a, b = tiny_models()
    compare(a, b, data, layers_a=["1"], layers_b=["1"])  # progress on (the default), stderr a pipe here
    assert capfd.readouterr() == ("", "")  # not even the blank line a stopped bar leaves


def test_cca_on_layers_wider_than_the_samples_is_refused_naming_the_layers_and_the_fixes():
    wide = nn.Sequential(nn.Linear(6, 40), nn.ReLU()).double()
    x = torch.randn(30, 6, dtype=torch.float64)
    with pytest.raises(SimkitError, match=r"cca would be undefined .*'0' \(model_a\) \(40 features\).*`cca_eps`"):
        compare(wide, wide, x, layers_a=["0"], layers_b=["0"], metrics=["cca"], progress=False)
    ridge = compare(wide, wide, x, layers_a=["0"], layers_b=["0"], metrics=["cca"], cca_eps=0.1, progress=False)
    assert np.isfinite(ridge.matrix("cca").to_numpy()).all()


def test_the_cause_of_a_nan_reaches_the_summary_and_the_report(data):
    from simkit.report import compare as compare_report

    a, _ = tiny_models()
    const = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 2)).double()
    with torch.no_grad():
        const[0].weight.zero_()
    with pytest.warns(RuntimeWarning):
        result = compare(a, const, data, layers_a=["1"], layers_b=["0"], metrics=["linear_cka"], progress=False)
    assert len(result.summary["warnings"]) == 1 and "'0' (model_b)" in result.summary["warnings"][0]
    cautions = compare_report.context(result)["cautions"]
    assert any("the warnings below say why" in c for c in cautions)
    assert any(c.startswith("warning: ") and "'0' (model_b)" in c for c in cautions)
