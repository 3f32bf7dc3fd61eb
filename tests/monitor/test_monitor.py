"""``simkit.Monitor`` in a plain PyTorch loop: what it measures (against the engine's own numbers), what it
leaves untouched, and what reaches the run directory, TensorBoard, MLflow and W&B (each read back)."""

from __future__ import annotations

import copy
import random

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import simkit
from simkit.errors import SimkitError
from simkit.monitor import Monitor
from simkit.monitor.convergence import convergence, depth_order, stable_step
from tests.monitor.helpers import tensorboard_events, tiny, train, wandb_history

pytestmark = pytest.mark.usefixtures("one_thread")


def diagonal(result, metric: str = "unbiased_cka") -> np.ndarray:
    """The same-layer values of a CompareResult, in layer order."""
    return np.diag(result.matrix(metric).to_numpy())


# ------------------------------------------------------------------------------------ run dir and trackers


def test_a_plain_loop_logs_values_with_chance_to_the_run_dir_tensorboard_and_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from simkit.monitor import MLflowTracker

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 asks before using a file store
    uri = (tmp_path / "mlruns").as_uri()
    mlflow_tracker = MLflowTracker(tracking_uri=uri, experiment="simkit-test")
    model, data = tiny()
    run = tmp_path / "run"
    monitor = Monitor(model, data, every=5, n=128, metrics=["unbiased_cka", "linear_cka"], run_dir=run,
                      trackers=["tensorboard", mlflow_tracker])
    train(model, data, 20, monitor.step)
    result = monitor.close()

    steps = pd.read_csv(run / "steps.csv")
    assert sorted(set(steps["step"])) == [0, 5, 10, 15, 20]
    assert len(steps) == 5 * 2 * 3                                    # steps × metrics × layers (same pairs)
    assert {"value", "chance", "null_p95", "beats_chance"} <= set(steps.columns)
    first = steps[steps["step"] == 0]
    assert np.allclose(first["value"], 1.0)                           # reference "first": itself at step 0
    unbiased = steps["metric"] == "unbiased_cka"                      # biased CKA's chance grows at small batches
    assert steps.loc[unbiased, "chance"].abs().max() < 0.05 < steps.loc[~unbiased, "chance"].min()
    assert steps["beats_chance"].all() and (steps["null_p95"] > steps["chance"]).all()
    later = steps[(steps["step"] == 20) & (steps["metric"] == "unbiased_cka")]
    assert (later["value"] < 1.0 - 1e-3).any()                        # training moved the layers
    assert simkit.load(run).kind == "trend" and (run / "report.html").is_file()
    figures = sorted(p.name for p in (run / "figures").iterdir())
    assert figures == sorted(f"{stem}.{ext}" for ext in ("png", "svg") for stem in (
        "unbiased_cka-over-training", "linear_cka-over-training", "stable-step-by-depth"))
    assert result.tables["steps"]["value"].tolist() == pytest.approx(steps["value"].tolist())

    events = tensorboard_events(run / "tensorboard")
    expected = steps[(steps["metric"] == "unbiased_cka") & (steps["layer"] == "blocks.1")]
    scalars = events.Scalars("similarity/unbiased_cka/blocks.1")
    assert [e.step for e in scalars] == expected["step"].tolist()
    assert [e.value for e in scalars] == pytest.approx(expected["value"].tolist(), abs=1e-6)
    chance = events.Scalars("chance/unbiased_cka/blocks.1")
    assert [e.value for e in chance] == pytest.approx(expected["chance"].tolist(), abs=1e-6)
    images = events.Images("matrix/unbiased_cka")
    assert [i.step for i in images] == [0, 5, 10, 15, 20] and images[0].width > 50

    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(mlflow_tracker.run_id, "similarity/unbiased_cka/blocks.1")
    assert [m.step for m in history] == expected["step"].tolist()
    assert [m.value for m in history] == pytest.approx(expected["value"].tolist(), abs=1e-12)
    artifacts = [a.path for a in client.list_artifacts(mlflow_tracker.run_id, "similarity")]
    assert len(artifacts) == 10 and "similarity/unbiased_cka_step00000020.png" in artifacts
    assert client.get_run(mlflow_tracker.run_id).info.status == "FINISHED"


def test_steps_parquet_equals_steps_csv_when_pyarrow_is_installed(tmp_path):
    pytest.importorskip("pyarrow")
    model, data = tiny()
    monitor = Monitor(model, data, every=2, n=64, run_dir=tmp_path)
    train(model, data, 4, monitor.step)
    monitor.close()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"), pd.read_csv(tmp_path / "steps.csv"),
                                  check_dtype=False)


def test_steps_csv_holds_every_step_so_far_while_training(tmp_path):
    """steps.csv grows by each step's rows during the run (appended, not rewritten) and reads back as the
    monitor's own table at every step."""
    model, data = tiny()
    monitor = Monitor(model, data, every=2, n=64, run_dir=tmp_path, report=False, figures=())
    seen = []

    def on_step(step):
        if monitor.step(step) is not None:
            seen.append(pd.read_csv(tmp_path / "steps.csv"))

    train(model, data, 6, on_step)
    assert [sorted(set(frame["step"])) for frame in seen] == [[0], [0, 2], [0, 2, 4], [0, 2, 4, 6]]
    pd.testing.assert_frame_equal(seen[-1], monitor.table.frame(), check_dtype=False)
    monitor.close()


def test_a_fixed_references_grams_kept_between_steps_give_the_values_computed_afresh():
    """measure_step with a GramMemo (the reference's Grams computed at the first step, reused later) gives
    every column exactly as without it, at later steps whose activations differ."""
    from simkit.metrics.streaming.minibatch import GramMemo
    from simkit.monitor.measure import measure_step
    from simkit.settings.monitor import ProbeSettings

    generator = torch.Generator().manual_seed(3)
    reference = [torch.randn(96, 7, generator=generator), torch.randn(96, 5, generator=generator)]
    settings = ProbeSettings(batch_size=32).validate()
    memo = GramMemo()
    for step in range(3):
        acts = [r + 0.5 * step * torch.randn(r.shape, generator=generator) for r in reference]
        kept = measure_step(step, acts, reference, ["x", "y"], ["x", "y"], settings, memo)
        fresh = measure_step(step, acts, reference, ["x", "y"], ["x", "y"], settings)
        pd.testing.assert_frame_equal(kept, fresh)
    assert sorted(memo.grams) == [0, 1, 2]  # three batches of 32, computed once each


def test_wandb_offline_run_holds_each_value_and_its_chance(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    pytest.importorskip("wandb.proto.wandb_internal_pb2")
    from simkit.monitor import WandbTracker

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="simkit-test", dir=str(tmp_path), mode="offline")
    model, data = tiny()
    monitor = Monitor(model, data, every=3, n=64, trackers=[WandbTracker(run)], images=False)
    train(model, data, 6, monitor.step)
    steps = monitor.close().tables["steps"]
    run.finish()
    rows = [r for r in wandb_history(next(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))) if "simkit/step" in r]
    assert [int(r["simkit/step"]) for r in rows] == [0, 3, 6]
    expected = steps[steps["layer"] == "blocks.2"]
    assert [float(r["similarity/unbiased_cka/blocks.2"]) for r in rows] == pytest.approx(expected["value"].tolist())
    assert [float(r["chance/unbiased_cka/blocks.2"]) for r in rows] == pytest.approx(expected["chance"].tolist())


# ------------------------------------------------------------------------------------ what it measures


def test_a_fixed_reference_gives_exactly_what_compare_gives_on_the_probe():
    model, data = tiny(seed=0)
    reference, _ = tiny(seed=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.inputs, data.labels), batch_size=50)
    monitor = Monitor(model, loader, reference=reference, n=128, batch_size=32)   # its first 128 samples
    assert torch.equal(monitor.inputs, data.inputs[:128])
    rows = monitor.measure(0)
    expected = simkit.compare(model, reference, data.inputs[:128], metrics=["unbiased_cka"], batch_size=32,
                              progress=False)
    assert rows["value"].to_numpy() == pytest.approx(diagonal(expected), abs=1e-12)
    frame = expected.to_frame()
    same = frame[frame["layer_a"] == frame["layer_b"]]
    assert rows["chance"].to_numpy() == pytest.approx(same["null_mean"].to_numpy(), abs=1e-12)
    assert rows["null_p95"].to_numpy() == pytest.approx(same["null_p95"].to_numpy(), abs=1e-12)
    assert monitor.settings.reference == "fixed"


def test_the_final_reference_compares_every_step_with_the_last_one(tmp_path):
    model, data = tiny()
    kept = {}
    monitor = Monitor(model, data, every=5, n=128, reference="final", run_dir=tmp_path)

    def step(s):
        assert monitor.step(s) is None                                # values only once the last step is known
        if s in (0, 10):
            kept[s] = copy.deepcopy(model)

    train(model, data, 10, step)
    assert not (tmp_path / "steps.csv").exists() and len(list((tmp_path / "activations").iterdir())) == 3
    steps = monitor.close().tables["steps"]
    assert not (tmp_path / "activations").exists()
    assert sorted(set(steps["step"])) == [0, 5, 10]
    assert np.allclose(steps.loc[steps["step"] == 10, "value"], 1.0)
    expected = simkit.compare(kept[0], kept[10], data.inputs[:128], metrics=["unbiased_cka"], batch_size=128,
                              progress=False)
    assert steps.loc[steps["step"] == 0, "value"].to_numpy() == pytest.approx(diagonal(expected), abs=1e-12)


def test_a_reference_trained_alongside_is_measured_at_every_step():
    model, data = tiny(seed=0)
    other, _ = tiny(seed=1)
    monitor = Monitor(model, data, every=4, n=128, reference="alongside", reference_model=other)
    kept = {}

    def step(s):
        monitor.step(s)
        if s == 8:
            kept[s] = (copy.deepcopy(model), copy.deepcopy(other))
        train_other.send(s)

    def other_steps():
        optimizer = torch.optim.Adam(other.parameters(), lr=1e-2)
        while True:
            yield
            loss = torch.nn.functional.cross_entropy(other(data.inputs[:32]), data.labels[:32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    train_other = other_steps()
    next(train_other)
    train(model, data, 8, step)
    steps = monitor.close().tables["steps"]
    expected = simkit.compare(*kept[8], data.inputs[:128], metrics=["unbiased_cka"], batch_size=128, progress=False)
    assert steps.loc[steps["step"] == 8, "value"].to_numpy() == pytest.approx(diagonal(expected), abs=1e-12)
    assert not np.allclose(steps.loc[steps["step"] == 0, "value"], steps.loc[steps["step"] == 8, "value"])


def test_all_pairs_and_other_reference_layers():
    model, data = tiny(seed=0)
    reference, _ = tiny(seed=1)
    monitor = Monitor(model, data, reference=reference, reference_layers="blocks.0,blocks.2", pairs="all", n=64)
    rows = monitor.measure(0)
    assert len(rows) == 3 * 2 and set(rows["reference_layer"]) == {"blocks.0", "blocks.2"}


class Noise(nn.Module):
    """Draws from torch's generator in every forward, eval mode included."""

    def forward(self, x):
        return x + 0.01 * torch.randn_like(x)


def hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_measuring_leaves_modes_generators_grad_mode_batchnorm_and_hooks_as_they_were():
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), Noise(), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                          nn.Linear(4 * 38, 10))
    model.train()
    model[4].eval()                                                   # a mix of modes, kept per submodule
    model[6].register_forward_hook(lambda *args: None)                # the user's own hook stays
    x = torch.randn(64, 1, 40)
    monitor = Monitor(model, x, reference="first", layers=["1", "2", "6"], n=64, batch_size=16)
    modes = [m.training for m in model.modules()]
    statistics = model[1].running_mean.clone(), model[1].running_var.clone(), model[1].num_batches_tracked.clone()
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    before = hooks(model)

    rows = monitor.measure(0)

    assert rows is not None and len(rows) == 3
    assert [m.training for m in model.modules()] == modes
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    assert torch.is_grad_enabled() and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(statistics, (model[1].running_mean, model[1].running_var,
                                                              model[1].num_batches_tracked), strict=True))
    assert hooks(model) == before == 1
    with torch.no_grad():
        model.eval()
        model(x)
    assert not torch.equal(torch.get_rng_state(), states[0])        # the model does draw: the check can fail


# ------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"reference": "fixed"}, "`reference` fixed compares with `reference_model`"),
    ({"reference": "alongside"}, "`reference` alongside compares with `reference_model`"),
    ({"reference": "first", "reference_model": nn.Linear(2, 2)}, "`reference_model` is compared with only"),
    ({"reference_layers": "blocks.0"}, "`pairs` same pairs each layer"),
    ({"trackers": ["neptune"]}, "unknown tracker 'neptune'"),
    ({"trackers": [object()]}, "`trackers`: a object has no log"),
    ({"trackers": ["tensorboard"]}, "`trackers` tensorboard writes into `run_dir`"),
    ({"every": 0}, "`every` must be a positive integer, got 0"),
    ({"metrics": ["ridge_r2"]}, "unknown metric 'ridge_r2'"),
    ({"metrics": ["mutual_knn"], "n": 5000}, "store the probe's activations"),
])
def test_bad_arguments_are_one_line_errors(kwargs, message):
    model, data = tiny(n=64)
    with pytest.raises(SimkitError, match=message.replace("(", r"\(")) as info:
        Monitor(model, data, **kwargs)
    assert "\n" not in str(info.value)


def test_a_spec_string_probe_and_a_closed_monitor_are_refused():
    model, data = tiny(n=64)
    with pytest.raises(SimkitError, match="load it first with simkit.data.load_data"):
        Monitor(model, "mnist1d")
    monitor = Monitor(model, data, n=64)
    monitor.measure(0)
    monitor.close()
    with pytest.raises(SimkitError, match="this Monitor is closed"):
        monitor.measure(1)


def test_a_monitor_that_measured_nothing_says_so_and_releases_its_run_dir(tmp_path):
    model, data = tiny(n=64)
    monitor = Monitor(model, data, n=64, every=50, run_dir=tmp_path / "m")
    monitor.step(20)  # not a multiple of every: nothing measured
    with pytest.raises(SimkitError, match="measured nothing") as info:
        monitor.close()
    assert "\n" not in str(info.value)
    again = Monitor(model, data, n=64, every=10, run_dir=tmp_path / "m")  # the directory is free again
    again.step(10)
    assert not again.close().tables["steps"].empty


# ------------------------------------------------------------------------------------ convergence


def test_stable_step_is_the_first_step_after_the_last_excursion():
    steps = np.array([0, 10, 20, 30, 40])
    assert stable_step(steps, np.array([0.2, 0.5, 0.9, 0.52, 0.5]), 0.05) == 30
    assert stable_step(steps, np.array([0.5, 0.5, 0.5, 0.5, 0.5]), 0.05) == 0
    assert stable_step(steps, np.array([0.5, np.nan, 0.5, 0.5, 0.5]), 0.05) == 20   # NaN is never within δ
    assert np.isnan(stable_step(steps, np.array([0.5, 0.5, 0.5, 0.5, np.nan]), 0.05))


def series(values_by_layer: dict[str, list[float]]) -> pd.DataFrame:
    rows = [{"step": 10 * i, "metric": "unbiased_cka", "layer": layer, "reference_layer": layer, "depth": depth,
             "reference_depth": depth, "value": v}
            for depth, (layer, values) in enumerate(values_by_layer.items()) for i, v in enumerate(values)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("values", "order"), [
    ({"a": [0, 1, 1, 1], "b": [0, 0, 1, 1], "c": [0, 0, 0, 1]}, "bottom-up"),
    ({"a": [0, 0, 0, 1], "b": [0, 0, 1, 1], "c": [0, 1, 1, 1]}, "top-down"),
    ({"a": [0, 1, 1, 1], "b": [0, 1, 1, 1], "c": [0, 1, 1, 1]}, "together"),
    ({"a": [0, 0, 1, 1], "b": [0, 1, 1, 1], "c": [0, 0, 0, 1]}, "mixed"),
])
def test_depth_order_of_stable_steps(values, order):
    table = convergence(series(values), 0.05)
    found = depth_order(table, "unbiased_cka")
    assert found["order"] == order
    if order == "bottom-up":
        assert found["stable_steps"] == {"a": 10, "b": 20, "c": 30} and found["rank_correlation"] == pytest.approx(1)
