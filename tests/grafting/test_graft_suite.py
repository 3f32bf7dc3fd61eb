"""The graft suite's experiments (E1, E2 arms, E3 cones, resume) on tiny models, the runner's checks
before it starts its run directory; F3 runs in test_cli_graft."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from simkit.data import load_data
from simkit.errors import SimkitError
from simkit.grafting import GraftSettings, graft
from simkit.grafting.experiments import run_e1, run_e2, run_e3
from simkit.grafting.tasks import is_builtin, make_task, markov_tokens
from simkit.models import load_model

TINY = dict(model="simkit:llama:d=16,blocks=2", steps=6, n=16, seq_len=8, batch_size=8)


def inputs(settings):
    """(model, data) that ``settings`` name, loaded as `simkit graft` loads them."""
    model = load_model(settings.model, seed=settings.seed)
    data = None if settings.data is None else load_data(settings.data, n=settings.samples(is_builtin(model)),
                                                        seed=settings.seed)
    return model, data


def resolved_task(settings):
    model, data = inputs(settings)
    s = settings.resolved(is_builtin(model))
    return s, make_task(s, model, data)


@pytest.fixture(scope="module")
def tiny():
    return resolved_task(GraftSettings(**TINY))


def test_e1_builtin_zero_mismatches_over_1600_values(tiny):
    s, task = tiny
    e1 = run_e1(task, s)
    assert e1["gate"].tolist() == ["shadow", "net2net"]
    assert (e1["values_compared"] >= 1600).all() and (e1["values_compared"] == 8 * 8 * 50).all()
    assert (e1["mismatches"] == 0).all() and (e1["violations"] == 0).all()


def test_e2_three_arms(tiny, tmp_path):
    s, task = tiny
    e2, arms, summary = run_e2(task, s, tmp_path, resume=False)
    assert arms["arm"].tolist() == ["shadow", "net2net", "double_zero"]
    assert arms["branch_first_grad_step"].tolist()[:2] == [2, 1] and arms["max_abs_branch_grad"].iloc[2] == 0
    assert summary["e2_shadow_alpha_first_grad_step"] == 1
    assert summary["e2_shadow_branch_first_grad_step"] == 2
    assert summary["e2_net2net_branch_first_grad_step"] == 1
    assert summary["e2_net2net_alpha_first_grad_step"] == 2
    assert summary["e2_double_zero_max_abs_grad"] == 0.0
    dz = e2[e2["arm"] == "double_zero"]
    assert len(dz) == s.steps and (dz["alpha"] == 0).all() and (dz["undo_distance"] == 0).all()
    shadow = e2[e2["arm"] == "shadow"].reset_index(drop=True)
    # SGD without momentum: α after step 1 = −lr·∂L/∂α, so |α(2)| = lr·|grad(1)|
    assert shadow.loc[0, "alpha"] == 0.0
    np.testing.assert_allclose(abs(shadow.loc[1, "alpha"]), s.e2_lr * shadow.loc[0, "alpha_grad"], rtol=1e-5)
    np.testing.assert_allclose(shadow["undo_distance"], shadow["alpha"].abs() * shadow["branch_norm"], rtol=1e-12)
    # resume: finished arms are restored from their checkpoints and give the same table, bit for bit
    again, _, _ = run_e2(task, s, tmp_path, resume=True)
    pd.testing.assert_frame_equal(e2, again, check_exact=True)


def test_e3_cone_shrinks_with_depth(tiny):
    s, task = tiny
    e3, summary = run_e3(task, s)
    assert e3["site"].tolist() == ["embed", "blocks.0", "blocks.1"]
    # grafted graph (placeholder excluded): embed, gate, blocks_0, blocks_1, pow, mean, add, rsqrt, mul,
    # norm_weight, mul_1, head, output = 13 nodes; the cone is the gate and everything after the site
    # except norm_weight (a get_attr that does not depend on the stream)
    assert (e3["graph_nodes"] == 13).all()
    assert e3["cone_nodes"].tolist() == [11, 10, 9]
    assert (e3["mismatches"] == 0).all()
    assert np.isfinite(summary["e3_cone_cost_correlation"]) and summary["e3_sites"] == 3


def test_user_model_tasks(tmp_path):
    s, task = resolved_task(GraftSettings(model="simkit:cnn1d:channels=4,layers=2", data="synthetic:1x40", n=24,
                                          after="blocks.0", branch="conv", steps=6))
    assert task.loss_kind == "mse_to_fixed_random_target"
    x, target = task.data
    assert target.shape == (24, 10) and torch.equal(target, resolved_task(s)[1].data[1])  # fixed by the seed
    with pytest.warns(RuntimeWarning, match="E1 compared only 240 output values"):
        e1 = run_e1(task, s)
    assert (e1["mismatches"] == 0).all()
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(20, 1, 40)).astype(np.float32))
    np.save(tmp_path / "y.npy", np.arange(20) % 10)
    labelled, task = resolved_task(GraftSettings(model=s.model, after="blocks.1", steps=6,
                                                 data=f"npy:{tmp_path / 'x.npy'},labels={tmp_path / 'y.npy'}"))
    assert task.loss_kind == "cross_entropy" and labelled.branch == "mlp"


def test_settings_errors():
    with pytest.raises(SimkitError, match="`after` is required with a MODEL"):
        GraftSettings(model="simkit:mlp").resolved(builtin=False)
    with pytest.raises(SimkitError, match="`steps` must be an integer >= 6, got 2"):
        GraftSettings(steps=2).resolved(builtin=True)
    with pytest.raises(SimkitError, match="`n` must be a positive integer or None, got 0"):
        GraftSettings(n=0).validate()
    with pytest.raises(SimkitError, match="double-zero graft refused.*pass `allow_double_zero`"):
        GraftSettings(gate="double_zero").validate()
    with pytest.raises(SimkitError, match="`data` is required with a MODEL"):
        resolved_task(GraftSettings(model="simkit:cnn1d", after="blocks.0"))


def test_runner_validates_before_it_starts_the_run_directory(tmp_path):
    """Bad labels, a bad site or other inputs on resume leave an earlier run in ``run_dir`` as it was."""
    model = load_model("simkit:cnn1d:channels=4,layers=2")
    x = torch.randn(20, 1, 40, generator=torch.Generator().manual_seed(0))
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", np.arange(20) + 5)  # the model has 10 outputs
    data = load_data(f"npy:{tmp_path / 'x.npy'},labels={tmp_path / 'y.npy'}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "earlier.txt").write_text("kept")
    with pytest.raises(SimkitError, match=r"labels lie in \[5, 24\] but the model has 10 outputs"):
        graft(model, data, GraftSettings(after="blocks.0", steps=6), run_dir=run)
    with pytest.raises(SimkitError, match="unknown module 'blocks.9'"):
        graft(model, data, GraftSettings(after="blocks.9", steps=6), run_dir=run)
    with pytest.raises(SimkitError, match="`resume`: .* has no inputs.json"):
        graft(model, load_data(f"npy:{tmp_path / 'x.npy'}"), GraftSettings(after="blocks.0", steps=6),
              run_dir=run, resume=True)
    assert sorted(p.name for p in run.iterdir()) == ["earlier.txt"]


def test_markov_tokens_seeded_and_in_range():
    a = markov_tokens(10, 12, 50, seed=3)
    assert a.shape == (10, 12) and a.dtype == torch.int64 and 0 <= int(a.min()) and int(a.max()) < 50
    assert torch.equal(a, markov_tokens(10, 12, 50, seed=3)) and not torch.equal(a, markov_tokens(10, 12, 50, 4))


def test_e1_warns_and_notes_when_fewer_values_than_the_papers_1600_are_compared(tiny, tmp_path, monkeypatch):
    import warnings

    from simkit.grafting import experiments

    settings = GraftSettings(model="simkit:cnn1d:channels=4,layers=2", data="synthetic:1x40", n=24,
                             after="blocks.0", branch="conv", steps=6)
    s, task = resolved_task(settings)
    with pytest.warns(RuntimeWarning, match=r"E1 compared only 240 output values \(24 probe samples\), fewer "
                                            r"than the 1600 of the paper's check.*raise `n` \(--n\)"):
        e1 = run_e1(task, s)
    assert (e1["values_compared"] == 24 * 10).all() and (e1["mismatches"] == 0).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        run_e1(tiny[1], tiny[0])                         # 3200 values: no warning
    # the suite's summary keeps the count and says why it matters (E2, E3, F3 stubbed: only E1 runs)
    monkeypatch.setattr(experiments, "run_e2", lambda *a: (pd.DataFrame(), pd.DataFrame(), {}))
    monkeypatch.setattr(experiments, "run_e3", lambda *a: (pd.DataFrame(), {}))
    monkeypatch.setattr(experiments, "run_f3", lambda *a: (pd.DataFrame(), {}))
    with pytest.warns(RuntimeWarning, match="E1 compared only 240"):
        summary = graft(*inputs(settings), settings, run_dir=tmp_path / "run", progress=False).summary
    assert summary["e1_values_compared"] == 240 and "fewer than the 1600" in summary["e1_note"]
    assert json.loads((tmp_path / "run" / "inputs.json").read_text())["options"]["after"] == "blocks.0"
    # resume from Python refuses other inputs, as the CLI does
    with pytest.raises(SimkitError, match=r"other inputs \(seed: 0 → 1\)"):
        graft(*inputs(settings), replace(settings, seed=1), run_dir=tmp_path / "run", resume=True)


def test_e2_killed_right_after_a_checkpoint_resumes_with_every_row(tiny, tmp_path, monkeypatch):
    """The kill lands between fit's checkpoint of a step and anything after it: the rows up to that
    checkpoint are already written, so the resumed table equals the uninterrupted one, bit for bit."""
    import simkit.training.loop as loop

    s, task = tiny
    s = replace(s, steps=10)  # checkpoints every 2 steps
    reference, _, _ = run_e2(task, s, tmp_path / "ref", resume=False)
    real = loop.save_checkpoint

    def save_then_die(path, payload):
        real(path, payload)
        if not payload["finished"] and payload["step"] == 4:
            raise KeyboardInterrupt  # as a SIGKILL would stop it, right after the file is in place

    monkeypatch.setattr(loop, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_e2(task, s, tmp_path / "cut", resume=False)
    monkeypatch.setattr(loop, "save_checkpoint", real)
    again, _, summary = run_e2(task, s, tmp_path / "cut", resume=True)
    pd.testing.assert_frame_equal(reference, again, check_exact=True)
    assert summary["e2_shadow_branch_first_grad_step"] == 2
