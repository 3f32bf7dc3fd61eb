"""The Network of Theseus examples' shared note logic (examples/theseus_note.py): per-seed values from a
runs table, claims judged by simkit.stats.verdict, and the note's tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "examples"))
theseus_note = pytest.importorskip("theseus_note")
Claim, arm_values = theseus_note.Claim, theseus_note.arm_values


def series(values: list[float], first: int = 0) -> pd.Series:
    return pd.Series(values, index=range(first, first + len(values)), dtype=float)


def test_arm_values_picks_one_row_per_seed_of_the_matching_arm() -> None:
    runs = pd.DataFrame({"seed": [1, 1, 0, 0], "guide_init": ["trained", "random"] * 2,
                         "converted_accuracy": [0.9, 0.7, 0.8, 0.6]})
    got = arm_values(runs, "converted_accuracy", guide_init="random")
    assert list(got.index) == [0, 1] and list(got) == [0.6, 0.7]


def test_above_claim_is_reproduced_only_when_the_paired_interval_clears_the_size() -> None:
    base = series([0.70, 0.71, 0.69, 0.70, 0.72])
    clear = Claim("gain", "", base + series([0.20, 0.21, 0.19, 0.205, 0.195]), base, size=0.15)
    assert clear.verdict() == "reproduced"
    assert clear.interval().low > 15
    noisy = Claim("gain", "", base + series([0.30, 0.01, 0.25, 0.02, 0.22]), base, size=0.15)
    assert noisy.interval().mean > 15 and noisy.interval().low < 15
    assert noisy.verdict() == "direction only"
    below = Claim("gain", "", base + series([0.05, 0.06, 0.04, 0.05, 0.05]), base, size=0.15)
    assert below.verdict() == "not reproduced"


def test_claims_pair_by_seed_not_by_position() -> None:
    a = pd.Series([0.9, 0.5], index=[0, 1])
    b = pd.Series([0.4, 0.8], index=[1, 0])  # seed 0: 0.8, seed 1: 0.4
    interval = Claim("d", "", a, b).interval()
    assert interval.mean == pytest.approx(100 * ((0.9 - 0.8) + (0.5 - 0.4)) / 2)
    assert interval.std == pytest.approx(0.0, abs=1e-9)


def test_within_claim_needs_both_sides_of_the_interval_inside_the_band() -> None:
    base = series([0.70, 0.72, 0.69, 0.71, 0.70])
    near = Claim("near", "", base + series([0.01, -0.01, 0.0, 0.01, -0.005]), base, size=0.05, kind="within")
    assert near.verdict() == "reproduced"
    wide = Claim("near", "", base + series([0.12, -0.10, 0.09, -0.08, 0.02]), base, size=0.05, kind="within")
    assert abs(wide.interval().mean) < 5 and wide.verdict() == "direction only"
    far = Claim("near", "", base - 0.3, base, size=0.05, kind="within")
    assert far.verdict() == "not reproduced"
    one = Claim("near", "", series([0.7]), series([0.7]), size=0.05, kind="within")
    assert one.verdict() == "too few seeds"


def test_level_claim_and_report_rows() -> None:
    level = Claim("acc", "", series([0.93, 0.94, 0.92]), size=0.90)
    assert level.verdict() == "reproduced" and "95 % CI" in level.markdown()
    report = Claim("kd", "", series([0.8, 0.7, 0.75]), series([0.7, 0.7, 0.7]), kind="report")
    assert report.verdict() == "reported, no claim"
    lower = Claim("ppl", "", series([3.0, 3.1, 2.9]), series([3.5, 3.6, 3.4]), size=0.2, kind="below", scale=1)
    assert lower.verdict() == "reproduced"
    assert "pts" not in lower.markdown() and "pts" in report.markdown()


def test_per_seed_table_and_header_record_what_the_note_needs() -> None:
    lines = theseus_note.per_seed_table({"a": series([0.5, 0.7]), "b": series([0.6], first=1)})
    assert lines[2] == "| 0 | 50.0 |  |" and lines[3] == "| 1 | 70.0 | 60.0 |"
    assert lines[4].startswith("| mean ± std | 60.0 ± 14.1")
    head = "\n".join(theseus_note.header("T", "python x.py", "0.1 / 0.2 / 0.3", 90))
    for text in ("Commit:", "CPU:", "before: 0.1 / 0.2 / 0.3", "Run time: 90 s"):
        assert text in head
    table = theseus_note.frame_markdown(pd.DataFrame({"x": [1.23456], "y": ["a"]}))
    assert table.splitlines() == ["| x | y |", "|---|---|", "| 1.23 | a |"]


def test_schedule_experiment_gives_joint_the_module_updates_progressive_used() -> None:
    schedules = pytest.importorskip("theseus_schedules")
    args = schedules.parse([])
    s = schedules.base_settings(args, 3).validate()
    assert s.schedule == schedules.STAGED and s.baselines == [] and s.auto_stages and s.plateau_budget
    assert s.seed == 3 and s.seeds == 1 and s.align_val
    joint = schedules.joint_settings(s, 36 * 50 + 7).validate()
    assert joint.schedule == ["joint"] and joint.stage_steps == 50 and joint.effective_stop_loss is None
    summary = pd.DataFrame({"seed": [0] * 7, "schedule": ["progressive"] * 6 + ["joint"],
                            "stage": [f"stage{i}" for i in range(1, 7)] + ["joint"], "steps": [10] * 6 + [35]})
    updates = schedules.module_updates(summary).set_index("schedule")["updates"]
    assert updates["progressive"] == 10 * 21 == updates["joint"]


def test_schedule_order_lists_neighbours_by_measured_mean() -> None:
    schedules = pytest.importorskip("theseus_schedules")
    values = {"progressive": series([0.80, 0.82, 0.81]), "sequential": series([0.70, 0.69, 0.71]),
              "independent": series([0.60, 0.62, 0.61]), "joint": series([0.84, 0.87, 0.855])}
    lines = schedules.order_lines(values)
    assert lines[0].startswith("Measured order: joint 85.5 > progressive 81.0 > sequential 70.0 > independent")
    assert "| joint − progressive |" in lines[4] and lines[4].endswith("| yes |")
    gate = Claim("gate", "", series([0.95, 0.96, 0.97]), size=0.90)
    claims = schedules.claims(values, values, gate)
    assert [c.verdict() for c in claims[:2]] == ["not reproduced", "not reproduced"]
    failed = Claim("gate", "", series([0.80, 0.82, 0.81]), size=0.90)
    assert schedules.claims(values, values, failed)[0].verdict().startswith("not testable at this scale")


def test_mnist1d_designs_keep_e1_as_it_ran_and_give_every_other_design_the_plateau_rule() -> None:
    first = pytest.importorskip("theseus_mnist1d")
    e1 = first.settings(first.parse([])).validate()
    assert e1.baseline_budget == "steps" and e1.steps_per_stage == 300 and e1.seeds == 5
    assert e1.guide_init == ["trained", "random"] and e1.baselines == ["scratch", "kd"]
    row_a = first.settings(first.parse(["--design", "row-a"])).validate()
    assert row_a.baseline_budget == "plateau" and row_a.steps_per_stage == 1000 and row_a.seeds == 3
    assert first.parse(["--design", "row-a-untrained"]).out == Path("runs/theseus_mnist1d_row_a_untrained")
    assert first.settings(first.parse(["--design", "dmnn"])).validate().metric == ["linear_cka", "dmnn"]


def test_a_row_that_requires_the_guides_margin_is_not_testable_without_it() -> None:
    scratch = series([0.90, 0.91, 0.92])
    converted = scratch + series([0.03, 0.04, 0.035])
    small_margin = Claim("guide margin", "", scratch + series([0.02, -0.02, 0.01]), scratch)
    gated = Claim("gain", "", converted, scratch, requires=small_margin)
    assert gated.verdict().startswith("not testable at this scale (guide margin: ")
    big_margin = Claim("guide margin", "", scratch + series([0.06, 0.07, 0.065]), scratch)
    assert Claim("gain", "", converted, scratch, requires=big_margin).verdict() == "reproduced"


def test_vit_pretraining_set_is_generated_with_another_seed_and_leaves_random_state_alone() -> None:
    pytest.importorskip("mnist1d")
    vit = pytest.importorskip("theseus_vit")
    import random

    import numpy as np

    from simkit.data import load_data

    state = np.random.get_state()[1].copy(), random.getstate()
    data = vit.pretraining_data(500, 1)
    assert tuple(data.inputs.shape) == (400, 1, 40) and data.labels is not None and len(data.labels) == 400
    assert (np.random.get_state()[1] == state[0]).all() and random.getstate() == state[1]
    standard = load_data("mnist1d").inputs[:400]
    assert not any(bool((row == standard).all(dim=(1, 2)).any()) for row in data.inputs[:50])
    s = vit.settings(vit.parse([])).validate()
    assert s.train_guide == 0 and s.baselines == ["scratch", "kd"] and s.align_val and s.seeds == 5


def test_deep_to_shallow_design_gives_every_arm_the_plateau_rule_with_a_floor_and_a_cap() -> None:
    d2s = pytest.importorskip("theseus_deep_to_shallow")
    s = d2s.settings(d2s.parse(["--floor-epochs", "24", "--head-epochs", "4", "--cap-epochs", "90"])).validate()
    assert s.effective_head_epochs + s.effective_finetune_epochs == 24
    assert s.baseline_budget == "plateau" and s.baseline_max_epochs == 90 and s.seeds == 8 and s.group == 2
    assert s.guide_init == ["trained", "random"] and s.baselines == ["scratch"]
    charlm = pytest.importorskip("theseus_charlm")
    assert charlm.settings(charlm.parse([])).validate().seeds == 3
