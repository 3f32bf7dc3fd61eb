"""Network of Theseus, issue 38: the one budget rule (``baseline_budget="plateau"``, the default). Every arm
(converted, scratch, distillation) trains until it is no longer still improving on validation, at least the
floor (equal labelled epochs), at most the cap; runs.csv and baselines.csv say why each stopped; for a
language model the alignment steps count as labelled steps."""

from __future__ import annotations

import math

import pytest
import torch

from simkit.conversion import ConvertSettings
from simkit.data import Dataset
from simkit.models.llama import TinyLlama
from tests.conversion.test_conversion import QUICK, _token_data, run, tiny_data, tiny_guide

N_TRAIN = 192 - round(192 * 0.1)  # tiny_data: 192 training rows, 10 % held out for validation
PER_EPOCH = math.ceil(N_TRAIN / 64)  # QUICK's fine-tuning batch
ROLES = ("scratch", "kd")
# a learning rate too small to change a validation score: every epoch after the first is "no better"
FROZEN = dict(QUICK, baselines=["scratch", "kd"], steps_per_stage=2, finetune_lr=1e-12)


def _converted_labelled(row) -> int:
    return int(row["head_steps"] + row["finetune_steps"])


def test_plateau_is_the_default_and_the_earlier_rules_stay_options():
    settings = ConvertSettings().validate()
    assert settings.baseline_budget == "plateau" and settings.plateau_budget
    assert settings.floor_epochs == settings.effective_head_epochs + settings.effective_finetune_epochs
    assert settings.cap_epochs == settings.baseline_max_epochs
    assert ConvertSettings(baseline_max_epochs=1.0).validate().cap_epochs == settings.floor_epochs  # never below
    for rule in ("steps", "labelled"):
        assert not ConvertSettings(baseline_budget=rule).validate().plateau_budget
    resolved = settings.resolved()
    assert (resolved["floor_epochs"], resolved["cap_epochs"]) == (settings.floor_epochs, settings.cap_epochs)


def test_every_arm_stops_on_its_plateau_once_past_the_floor():
    # patience 1: a flat validation score stops a run after its second epoch, but the floor is 4 epochs
    result = run(tiny_guide(), tiny_data(), **dict(FROZEN, head_epochs=1, finetune_epochs=3, baseline_epochs=0,
                                                   baseline_patience=1, baseline_max_epochs=50))
    row = result.tables["runs"].iloc[0]
    floor = 4 * PER_EPOCH
    assert _converted_labelled(row) == row["labelled_steps"] == floor and row["stopped"] == "plateau"
    for role in ROLES:
        assert (row[f"{role}_steps"], row[f"{role}_stopped"]) == (floor, "plateau")
        assert row[f"{role}_labelled_epochs"] == pytest.approx(row["labelled_epochs"], abs=1e-3)
    baselines = result.tables["baselines"]
    assert set(baselines["stop"]) == {"plateau"} and set(baselines["stopped"]) == {"validation"}
    assert (baselines["min_steps"] == floor).all()


def test_a_flat_score_past_the_floor_stops_after_patience_epochs():
    # floor 2 epochs (head 1 + fine-tuning 1), patience 3: the best epoch is the first, so the fine-tuning
    # stops at the evaluation 3 epochs after it; the baselines' floor is then the converted arm's 5 labelled
    # epochs (head 1 + fine-tuning 4), past their own plateau (4 epochs)
    result = run(tiny_guide(), tiny_data(), **dict(FROZEN, head_epochs=1, finetune_epochs=1, baseline_epochs=0,
                                                   baseline_patience=3, baseline_max_epochs=50))
    row = result.tables["runs"].iloc[0]
    assert row["finetune_steps"] == 4 * PER_EPOCH and row["stopped"] == "plateau"
    assert not row["still_improving"] and row["best_step"] == PER_EPOCH
    for role in ROLES:
        assert (row[f"{role}_steps"], row[f"{role}_stopped"]) == (5 * PER_EPOCH, "plateau")
        assert not row[f"{role}_still_improving"]


def test_an_arm_still_improving_stops_at_the_cap_stated_in_advance():
    result = run(tiny_guide(), tiny_data(), **dict(QUICK, baselines=["scratch", "kd"], steps_per_stage=2,
                                                   finetune_lr=0.05, head_epochs=1, finetune_epochs=1,
                                                   baseline_epochs=0, baseline_patience=50, baseline_max_epochs=4))
    row = result.tables["runs"].iloc[0]
    cap = 4 * PER_EPOCH
    assert (_converted_labelled(row), row["stopped"]) == (cap, "cap")
    for role in ROLES:
        assert (row[f"{role}_steps"], row[f"{role}_stopped"]) == (cap, "cap")
    assert result.meta["settings"]["cap_epochs"] == 4.0


def test_without_a_validation_split_every_arm_trains_the_floor():
    result = run(tiny_guide(), tiny_data(), **dict(QUICK, baselines=["scratch"], steps_per_stage=2, head_epochs=1,
                                                   finetune_epochs=2, baseline_epochs=0, val_fraction=0.0))
    row = result.tables["runs"].iloc[0]
    per_epoch = math.ceil(192 / 64)
    assert (_converted_labelled(row), row["stopped"]) == (3 * per_epoch, "floor")
    assert (row["scratch_steps"], row["scratch_stopped"]) == (3 * per_epoch, "floor")


def test_the_earlier_rules_report_a_fixed_budget():
    result = run(tiny_guide(), tiny_data(), **dict(QUICK, baselines=["scratch"], steps_per_stage=2,
                                                   baseline_epochs=1, baseline_budget="steps"))
    row = result.tables["runs"].iloc[0]
    assert (row["stopped"], row["scratch_stopped"]) == ("fixed", "fixed")
    assert row["scratch_steps"] == max(row["steps"], PER_EPOCH)


def test_a_language_models_alignment_counts_as_labelled_steps_for_the_baselines_floor():
    torch.manual_seed(0)
    guide = TinyLlama(vocab=12, d=16, heads=2, blocks=2, max_len=16).eval()
    data = Dataset(_token_data(96, 0), None, "tokens", test=Dataset(_token_data(32, 1), None, "tokens"))
    # 2 stages × 12 alignment steps at batch 32 = 24 × 32 / 16 = 48 fine-tuning steps of batch 16
    result = run(guide, data, recipe="attention-to-rnn", **dict(QUICK, baselines=["scratch", "kd"], batch_size=32,
                                                                finetune_batch_size=16, steps_per_stage=12,
                                                                baseline_epochs=0, baseline_max_epochs=30))
    row = result.tables["runs"].iloc[0]
    per_epoch = math.ceil((96 - round(96 * 0.1)) / 16)  # the native test split: all 96 rows train
    assert row["align_steps"] == 24
    assert row["labelled_steps"] == _converted_labelled(row) + math.ceil(24 * 32 / 16)
    assert row["labelled_epochs"] == pytest.approx(row["labelled_steps"] / per_epoch, abs=1e-3)
    for role in ROLES:  # at least the converted arm's labelled steps, alignment included
        assert row[f"{role}_steps"] >= row["labelled_steps"] > _converted_labelled(row)


def test_runs_csv_and_the_report_name_every_arms_budget_and_stop(tmp_path):
    from simkit import load, save_run

    result = run(tiny_guide(), tiny_data(), **dict(FROZEN, head_epochs=1, finetune_epochs=1, baseline_epochs=0,
                                                   baseline_patience=1, baseline_max_epochs=50))
    save_run(result, tmp_path, report=True)
    runs = load(tmp_path).tables["runs"]
    assert {"labelled_steps", "labelled_epochs", "steps", "stopped", "scratch_steps", "scratch_labelled_epochs",
            "scratch_stopped", "kd_steps", "kd_labelled_epochs", "kd_stopped"} <= set(runs.columns)
    html = next(tmp_path.glob("*.html")).read_text()
    assert "<th>stopped</th>" in html and "plateau 1" in html
    assert "every arm trains until it is no longer still improving on validation" in html


def test_a_language_model_can_score_only_the_positions_after_its_context():
    import torch.nn.functional as F

    from simkit.conversion.task import IGNORE, Task
    from simkit.errors import SimkitError

    ids = _token_data(6, 0)
    task = Task.infer(ids, None, 5)
    targets = task.targets(ids, None)
    assert (targets[:, :5] == IGNORE).all() and torch.equal(targets[:, 5:], ids[:, 5:])
    logits = torch.randn(6, ids.shape[1], 12)
    # perplexity = exp(mean NLL of the tokens at positions 5.., each predicted from the position before)
    nll = F.cross_entropy(logits[:, 4:-1].reshape(-1, 12), ids[:, 5:].reshape(-1))
    assert task.evaluate(lambda x: logits[: len(x)], ids, targets, batch_size=6) == pytest.approx(math.exp(nll))
    assert Task.infer(ids, None).score_from == 0
    with pytest.raises(SimkitError, match="`lm_score_from` must be an integer from 0 to 15"):
        Task.infer(ids, None, 16)
