"""Network of Theseus, issue 23: seeds and intervals, equal chances for every arm (the converted arm's
best validation epoch, labelled-training epochs), distillation with labels, extra alignment inputs, the
ViT's patch-token alignment and the metric's catalogue name."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from simkit.conversion import ConvertSettings, convert
from simkit.conversion.finetune import distill
from simkit.conversion.task import Task
from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.stats import paired_difference, t_interval
from simkit.training import TrainHistory
from tests.conversion.test_conversion import QUICK, run, tiny_data, tiny_guide
from tests.conversion.test_conversion_baselines import N_TRAIN, PER_EPOCH

TIMING = ["seconds", "align_seconds"]
SEEDS = dict(QUICK, baselines=["scratch", "kd"], steps_per_stage=2, baseline_epochs=1, seeds=2)


@pytest.fixture(scope="module")
def two_seeds():
    return run(tiny_guide(), tiny_data(), **SEEDS)


def test_every_arm_and_baseline_runs_once_per_seed(two_seeds):
    runs, baselines = two_seeds.tables["runs"], two_seeds.tables["baselines"]
    assert runs["seed"].tolist() == [0, 1]
    assert sorted(map(tuple, baselines[["seed", "baseline"]].to_numpy())) == [(0, "kd"), (0, "scratch"),
                                                                              (1, "kd"), (1, "scratch")]
    for name in ("stages", "stage_summary", "curves", "validation"):
        assert set(two_seeds.tables[name]["seed"]) == {0, 1}, name
    assert runs.loc[0, "converted_accuracy"] != runs.loc[1, "converted_accuracy"] or \
        runs.loc[0, "probe_accuracy"] != runs.loc[1, "probe_accuracy"]
    assert two_seeds.meta["seeds"] == [0, 1] and two_seeds.summary["seeds"] == [0, 1]


def test_seed_one_of_a_two_seed_run_is_the_one_seed_run_of_seed_one():
    """Without a validation split the data split does not depend on the seed, so the second seed's row
    is exactly a one-seed run with that seed: every arm and baseline really runs per seed."""
    options = dict(SEEDS, val_fraction=0.0)
    both = run(tiny_guide(), tiny_data(), **options).tables["runs"]
    alone = run(tiny_guide(), tiny_data(), **dict(options, seeds=1, seed=1)).tables["runs"]
    pd.testing.assert_frame_equal(both[both["seed"] == 1].drop(columns=TIMING).reset_index(drop=True),
                                  alone.drop(columns=TIMING).reset_index(drop=True))


def test_aggregate_and_summary_are_the_t_intervals_of_the_seed_values(two_seeds):
    runs, agg, s = two_seeds.tables["runs"], two_seeds.tables["aggregate"], two_seeds.summary
    converted = agg[agg["role"] == "converted"].iloc[0]
    expected = t_interval(runs["converted_accuracy"])
    assert (converted["accuracy_mean"], converted["accuracy_std"], converted["accuracy_low"],
            converted["accuracy_high"], converted["seeds"]) == pytest.approx(
        (expected.mean, expected.std, expected.low, expected.high, 2))
    gain = paired_difference(runs["converted_accuracy"], runs["scratch_accuracy"])
    assert (converted["gain_over_scratch_mean"], converted["gain_over_scratch_low"],
            converted["gain_over_scratch_high"]) == pytest.approx((gain.mean, gain.low, gain.high))
    assert bool(converted["beyond_noise"]) == (gain.low > 0 or gain.high < 0)
    assert (s["gain_over_scratch"], s["gain_over_scratch_low"], s["gain_over_scratch_high"]) == pytest.approx(
        (gain.mean, gain.low, gain.high))
    assert s["gain_beyond_noise"] == (gain.low > 0 or gain.high < 0)
    assert s["converted_accuracy"] == pytest.approx(runs["converted_accuracy"].mean())
    scratch = agg[agg["role"] == "scratch"].iloc[0]
    assert scratch["accuracy_mean"] == pytest.approx(runs["scratch_accuracy"].mean())
    assert set(agg["role"]) == {"converted", "probe", "guide", "scratch", "kd"}


def test_one_seed_has_no_interval_and_is_never_beyond_noise():
    result = run(tiny_guide(), tiny_data(), **dict(SEEDS, seeds=1, baselines=["scratch"]))
    s = result.summary
    assert s["gain_over_scratch"] == pytest.approx(s["converted_accuracy"] - s["scratch_accuracy"])
    assert s["gain_over_scratch_low"] is None and s["gain_over_scratch_high"] is None
    assert s["gain_beyond_noise"] is False and s["seeds"] == [0]
    assert "kd_accuracy" not in s


def _count_steps():
    counter = {"n": 0}

    def hook(optimizer, args, kwargs):
        counter["n"] += 1

    return counter, register_optimizer_step_post_hook(hook)


def test_a_two_seed_run_resumes_without_recomputing_and_after_an_interruption(tmp_path):
    options = dict(SEEDS, run_dir=tmp_path / "run")
    reference = run(tiny_guide(), tiny_data(), **options)
    assert (tmp_path / "run/checkpoints/trained-progressive-linear_cka-stage2_s1.pt").is_file()
    assert (tmp_path / "run/checkpoints/scratch_s0.pt").is_file()
    counter, handle = _count_steps()
    try:
        again = run(tiny_guide(), tiny_data(), **dict(options, resume=True))
    finally:
        handle.remove()
    assert counter["n"] == 0  # every phase of every seed restored from its checkpoint
    for name, table in reference.tables.items():
        pd.testing.assert_frame_equal(again.tables[name].drop(columns=TIMING, errors="ignore"),
                                      table.drop(columns=TIMING, errors="ignore"), obj=name)

    # interrupted in the middle of the second seed, then resumed: the same result
    total = sum(reference.tables["runs"]["steps"]) + sum(reference.tables["baselines"]["steps"])
    stop_after = total - 5

    def interrupt(optimizer, args, kwargs):
        counter["n"] += 1
        if counter["n"] == stop_after:
            raise KeyboardInterrupt

    counter["n"] = 0
    handle = register_optimizer_step_post_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            run(tiny_guide(), tiny_data(), **dict(options, run_dir=tmp_path / "cut"))
    finally:
        handle.remove()
    resumed = run(tiny_guide(), tiny_data(), **dict(options, run_dir=tmp_path / "cut", resume=True))
    for name in ("runs", "baselines", "aggregate", "validation"):
        pd.testing.assert_frame_equal(resumed.tables[name].drop(columns=TIMING, errors="ignore"),
                                      reference.tables[name].drop(columns=TIMING, errors="ignore"), obj=name)


def test_the_converted_arm_keeps_its_best_validation_epoch_by_the_baselines_rule(two_seeds):
    runs, validation = two_seeds.tables["runs"], two_seeds.tables["validation"]
    patience = ConvertSettings().baseline_patience
    for _, row in runs.iterrows():
        scores = validation[(validation["phase"] == "finetune") & (validation["seed"] == row["seed"])]
        assert scores["step"].tolist() == list(range(PER_EPOCH, row["finetune_steps"] + 1, PER_EPOCH))
        best = scores.loc[scores["val_accuracy"].idxmax()]
        assert (row["best_step"], row["val_accuracy"]) == (best["step"], best["val_accuracy"])
        assert row["still_improving"] == (row["best_step"] > row["finetune_steps"] - patience * PER_EPOCH)


def test_an_extended_baseline_extends_the_converted_arms_labelled_epochs():
    result = run(tiny_guide(), tiny_data(), **dict(SEEDS, seeds=1, baseline_epochs=5, baseline_max_epochs=4,
                                                   baselines=["scratch"], baseline_budget="steps"))
    row = result.tables["runs"].iloc[0]
    # head 1 epoch + fine-tuning extended from 1 to 3 epochs: the baselines' 5 epochs capped at 4
    assert (row["head_steps"], row["finetune_steps"]) == (PER_EPOCH, 3 * PER_EPOCH)
    assert row["labelled_epochs"] == 4 and result.meta["settings"]["finetune_epochs"] == 3
    assert row["scratch_steps"] == max(row["steps"], 4 * PER_EPOCH)
    assert row["scratch_labelled_epochs"] == pytest.approx(row["scratch_steps"] / PER_EPOCH, abs=1e-3)
    assert row["scratch_labelled_epochs"] >= row["labelled_epochs"]
    # no baseline: nothing to match
    alone = run(tiny_guide(), tiny_data(), **dict(SEEDS, seeds=1, baseline_epochs=5, baselines=[],
                                                  baseline_budget="steps"))
    assert alone.tables["runs"].iloc[0]["finetune_steps"] == PER_EPOCH


def test_a_labelled_budget_gives_the_baselines_the_converted_arms_labelled_epochs_not_its_alignment():
    result = run(tiny_guide(), tiny_data(), **dict(SEEDS, seeds=1, steps_per_stage=3 * PER_EPOCH, baseline_epochs=0,
                                                   baseline_budget="labelled"))
    row = result.tables["runs"].iloc[0]
    assert row["align_steps"] > 0
    for kind in ("scratch", "kd"):  # head + fine-tuning, not alignment + head + fine-tuning
        assert row[f"{kind}_steps"] == row["head_steps"] + row["finetune_steps"] < row["steps"]
        assert row[f"{kind}_labelled_epochs"] == pytest.approx(row["labelled_epochs"], abs=1e-3)
    assert result.meta["settings"]["baseline_budget"] == "labelled"
    with pytest.raises(SimkitError, match="`baseline_budget` must be one of plateau, steps, labelled"):
        ConvertSettings(recipe="conv-to-mlp", baseline_budget="epochs").validate()


def _distill_loss(alpha: float, labels: torch.Tensor, temperature: float = 2.0):
    """The loss ``distill`` minimises on the first 8 rows, through a fit function that evaluates it once."""
    torch.manual_seed(0)
    student, x = torch.nn.Linear(5, 3), torch.randn(8, 5)
    guide_logits = torch.randn(8, 3)
    seen = {}

    def fit_fn(model, loss_fn, data, params, **kwargs):
        seen["loss"] = float(loss_fn((torch.arange(8),)))
        return TrainHistory(losses=[seen["loss"]], steps=1)

    distill(student, Task("classification"), (x, labels), guide_logits, fit_fn, temperature, alpha=alpha)
    with torch.no_grad():
        logits = student(x)
        kl = torch.nn.functional.kl_div(torch.log_softmax(logits / temperature, -1),
                                        torch.log_softmax(guide_logits / temperature, -1), reduction="batchmean",
                                        log_target=True) * temperature ** 2
        ce = torch.nn.functional.cross_entropy(logits, labels)
    return seen["loss"], float(ce), float(kl)


def test_distillation_is_cross_entropy_plus_t2_kl_and_alpha_zero_is_label_free():
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    loss, ce, kl = _distill_loss(0.5, labels)
    assert loss == pytest.approx(0.5 * ce + 0.5 * kl, rel=1e-5)
    loss, ce, _ = _distill_loss(1.0, labels)
    assert loss == pytest.approx(ce, rel=1e-5)
    free, _, kl = _distill_loss(0.0, labels)
    assert free == pytest.approx(kl, rel=1e-5)
    assert _distill_loss(0.0, labels.flip(0))[0] == free  # labels unused
    assert _distill_loss(0.5, labels.flip(0))[0] != _distill_loss(0.5, labels)[0]


def test_kd_alpha_reaches_the_baseline_and_is_validated():
    data = tiny_data()
    options = dict(SEEDS, seeds=1, baselines=["kd"])
    label_free = run(tiny_guide(), data, **dict(options, kd_alpha=0.0)).tables["baselines"]
    labelled = run(tiny_guide(), data, **dict(options, kd_alpha=0.5)).tables["baselines"]
    assert label_free["test_accuracy"].iloc[0] != labelled["test_accuracy"].iloc[0] or \
        label_free["val_accuracy"].iloc[0] != labelled["val_accuracy"].iloc[0]
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(SimkitError, match="`kd_alpha`"):
            ConvertSettings(kd_alpha=bad).validate()


def test_extra_alignment_inputs_reach_the_alignment_but_not_the_labelled_phases():
    data = tiny_data()
    n_val = 192 - N_TRAIN
    base = run(tiny_guide(), data, **dict(SEEDS, seeds=1, baselines=["scratch"]))
    with_val = run(tiny_guide(), data, **dict(SEEDS, seeds=1, baselines=["scratch"], align_val=True))
    assert base.summary["align_samples"] == N_TRAIN and with_val.summary["align_samples"] == N_TRAIN + n_val
    assert with_val.extra["guide_forward_batches"] == math.ceil((N_TRAIN + n_val) / QUICK["batch_size"])
    # the labelled phases see the same rows: the scratch baseline is unchanged
    assert with_val.tables["baselines"]["test_accuracy"].tolist() == base.tables["baselines"]["test_accuracy"].tolist()
    settings = ConvertSettings(**dict(SEEDS, seeds=1, baselines=[], align_data="extra"))
    extra = Dataset(torch.randn(40, 1, 16), None, "extra")
    got = convert(tiny_guide(), data, settings, align_data=extra, progress=False)
    assert got.summary["align_samples"] == N_TRAIN + 40 and got.meta["n_align"] == N_TRAIN + 40
    with pytest.raises(SimkitError, match=r"\(1, 9\) per sample but the training inputs are \(1, 16\)"):
        convert(tiny_guide(), data, settings, align_data=Dataset(torch.randn(5, 1, 9), None, "x"), progress=False)
    with pytest.raises(SimkitError, match="only the record"):
        run(tiny_guide(), data, **dict(SEEDS, seeds=1, align_data="npy:x.npy"))
    with pytest.raises(SimkitError, match="`align_val`"):
        ConvertSettings(align_val=True, val_fraction=0.0).validate()


def test_the_metric_has_the_catalogue_name_and_cka_is_its_alias():
    assert ConvertSettings().validate().metric == ["linear_cka"]
    assert ConvertSettings(metric=["cka", "linear_cka", "dmnn"]).validate().metric == ["linear_cka", "dmnn"]
    with pytest.raises(SimkitError, match="unknown alignment loss 'cak'; closest: cka"):
        ConvertSettings(metric=["cak"]).validate()


def test_seeds_must_be_a_positive_integer():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(SimkitError, match="`seeds`"):
            ConvertSettings(seeds=bad).validate()
    assert ConvertSettings(seed=3, seeds=3).seed_list() == [3, 4, 5]


def test_a_guide_factory_builds_each_seeds_guide():
    built = []

    def factory(seed):
        built.append(seed)
        return tiny_guide(seed=seed)

    result = run(factory, tiny_data(), **dict(SEEDS, seed=4, baselines=[]))
    assert built == [4, 5] and result.meta["seed_models"] == "built for each seed"
    guides = result.tables["runs"].set_index("seed")["guide_accuracy"]
    assert list(guides.index) == [4, 5]


def test_skip_tokens_leave_leading_tokens_out_of_the_aligned_map_and_are_checked():
    from simkit.conversion.plans import Replacement, ReplacementPlan, resolve_plan
    from simkit.conversion.schedules import aligned

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.mix(x).mean(1))

    guide, x = Tokens(), torch.randn(3, 5, 4)
    plan = ReplacementPlan([Replacement("mix", lambda slot: torch.nn.Linear(4, 4), skip_tokens=2)])
    (slot,), _ = resolve_plan(plan, guide, lambda m: m(x))
    out = torch.randn(3, 5, 4)
    assert torch.equal(aligned(slot, out, None), out[:, 2:])
    for bad in (5, -1):
        with pytest.raises(SimkitError, match="skip_tokens"):
            resolve_plan(ReplacementPlan([Replacement("mix", lambda slot: torch.nn.Linear(4, 4), skip_tokens=bad)]),
                         guide, lambda m: m(x))
