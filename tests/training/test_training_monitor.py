"""ValidationMonitor in the shared loop: best weights, early stopping after min_steps, LR halving,
bit-identical resume with the monitor's state in the checkpoint."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

from simkit.errors import SimkitError
from simkit.training import TrainConfig, ValidationMonitor, fit, load_checkpoint


class Scripted:
    """evaluate() returning a fixed sequence of scores (one per call), recording the steps it saw."""

    def __init__(self, scores):
        self.scores, self.calls = list(scores), 0

    def __call__(self):
        value = self.scores[min(self.calls, len(self.scores) - 1)]
        self.calls += 1
        return value


def problem(seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(3, 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])

    def loss_fn(batch):
        xb, yb = batch
        return ((model(xb) - yb) ** 2).mean()

    return model, loss_fn, (x, y)


CFG = dict(batch_size=10, lr=1e-2, optimizer="adam", progress=False)  # 4 steps per epoch


def test_stops_after_patience_but_not_before_min_steps():
    model, loss_fn, data = problem()
    # improves at evaluations 1, 2, then never: patience 2 would stop at evaluation 4 (step 16) ...
    mon = ValidationMonitor(Scripted([0.1, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]), every=4, patience=2)
    hist = fit(model, loss_fn, data, TrainConfig(steps=100, **CFG), monitor=mon)
    assert (hist.steps, hist.stopped) == (16, "validation")
    assert [s for s, _ in mon.scores] == [4, 8, 12, 16] and mon.best_step == 8
    # ... unless min_steps is later: then it runs on to the first evaluation at or after min_steps
    model, loss_fn, data = problem()
    mon = ValidationMonitor(Scripted([0.1, 0.2] + [0.2] * 20), every=4, patience=2, min_steps=30)
    hist = fit(model, loss_fn, data, TrainConfig(steps=100, **CFG), monitor=mon)
    assert (hist.steps, hist.stopped) == (32, "validation")
    # never past the step budget: then the last step is evaluated and the run ends by its length
    model, loss_fn, data = problem()
    mon = ValidationMonitor(Scripted([0.1 * k for k in range(1, 30)]), every=4, patience=2)
    hist = fit(model, loss_fn, data, TrainConfig(steps=10, **CFG), monitor=mon)
    assert (hist.steps, hist.stopped) == (10, "steps")
    assert [s for s, _ in mon.scores] == [4, 8, 10]


def test_best_weights_are_the_best_evaluations_and_lower_is_better_works():
    model, loss_fn, data = problem()
    snapshots = []

    def evaluate():
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return [3.0, 1.0, 2.0, 5.0][len(snapshots) - 1]  # a perplexity: best (lowest) at evaluation 2

    mon = ValidationMonitor(evaluate, every=4, higher_is_better=False)
    fit(model, loss_fn, data, TrainConfig(steps=16, **CFG), monitor=mon)
    assert mon.best == 1.0 and mon.best_step == 8
    assert not torch.equal(model.weight, snapshots[1]["weight"])
    mon.restore_best(model)
    for k, v in model.state_dict().items():
        assert torch.equal(v, snapshots[1][k]), k


def test_lr_halves_after_lr_patience_evaluations_without_improvement():
    model, loss_fn, data = problem()
    mon = ValidationMonitor(Scripted([1.0, 0.5, 0.5, 0.5, 0.5, 0.5]), every=4, lr_patience=2)
    hist = fit(model, loss_fn, data, TrainConfig(steps=24, **CFG), monitor=mon)
    # no improvement at evaluations 2, 3 (steps 8, 12) → halved from step 13; again after 4, 5 (step 20)
    assert hist.lrs[:12] == [1e-2] * 12
    assert hist.lrs[12:20] == [5e-3] * 8 and hist.lrs[20:] == [2.5e-3] * 4
    assert mon.lr_cuts == 2


def test_monitor_state_resumes_bit_identically(tmp_path):
    def run(run_dir, interrupt_at=None, resume=False):
        model, loss_fn, data = problem()
        x_val = torch.randn(8, 3, generator=torch.Generator().manual_seed(9))

        def evaluate():
            with torch.no_grad():
                return -float(model(x_val).pow(2).mean())

        mon = ValidationMonitor(evaluate, every=4, patience=3, min_steps=12, lr_patience=2)

        def cb(step, loss):
            if step == interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)

        hist = fit(model, loss_fn, data, TrainConfig(steps=60, **CFG), run_dir=run_dir, resume=resume,
                   monitor=mon, callback=cb)
        mon.restore_best(model)
        return hist, mon, model

    full, mon_a, model_a = run(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", interrupt_at=10)
    assert load_checkpoint(tmp_path / "b" / "checkpoints" / "train.pt")["monitor"]["scores"]
    resumed, mon_b, model_b = run(tmp_path / "b", resume=True)
    assert resumed.losses == full.losses and resumed.lrs == full.lrs and resumed.stopped == full.stopped
    assert mon_b.scores == mon_a.scores and mon_b.best_step == mon_a.best_step
    for k, v in model_a.state_dict().items():
        assert torch.equal(v, model_b.state_dict()[k]), k
    # a finished checkpoint: the monitor's best weights come back without training
    again, mon_c, model_c = run(tmp_path / "b", resume=True)
    assert again.steps == full.steps and mon_c.best_step == mon_a.best_step
    for k, v in model_a.state_dict().items():
        assert torch.equal(v, model_c.state_dict()[k]), k


def test_resume_without_monitor_state_and_bad_arguments_are_refused(tmp_path):
    model, loss_fn, data = problem()
    fit(model, loss_fn, data, TrainConfig(steps=4, **CFG), run_dir=tmp_path)
    mon = ValidationMonitor(lambda: 0.0, every=2)
    with pytest.raises(SimkitError, match="without a validation monitor"):
        fit(model, loss_fn, data, TrainConfig(steps=4, **CFG), run_dir=tmp_path, resume=True, monitor=mon)
    for kwargs, match in (({"every": 0}, "`every`"), ({"every": 2, "patience": 0}, "`patience`"),
                          ({"every": 2, "lr_factor": 1.5}, "`lr_factor`")):
        with pytest.raises(SimkitError, match=match):
            ValidationMonitor(lambda: 0.0, **kwargs)
