"""The overall bar of long runs (simkit.progress.overall_progress): "stage 2 of 3 · arm 1 of 3"-style
phases, the loops' bars drawn inside it, its share done and time left; wired into convert and stitch.

A terminal is simulated by a rich Console on a StringIO with ``force_terminal``; the phases shown are
read from ``Overall.history`` (what the display said, in order), not from timing.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import simkit.progress as progress
from simkit.progress import overall_progress, phase, progress_bar, time_left


@pytest.fixture
def terminal(monkeypatch):
    """stderr as a terminal (a StringIO), and every Overall opened, in a list."""
    screen = io.StringIO()
    monkeypatch.setattr(progress, "make_console", lambda: Console(file=screen, force_terminal=True, width=200))
    opened: list[progress.Overall] = []

    class Recorded(progress.Overall):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(progress, "Overall", Recorded)
    return screen, opened


def run_loop(description: str, steps: int, *, transient: bool = True, stop_at: int | None = None) -> None:
    with progress_bar(True, transient=transient) as bar:
        task = bar.add_task(description, total=steps)
        for step in range(stop_at if stop_at is not None else steps):
            bar.update(task, completed=step + 1)


def test_time_left_is_the_average_pace_so_far():
    assert time_left(30.0, 1.5, 6) == pytest.approx(30.0 * 4.5 / 1.5)
    assert time_left(10.0, 4, 4) == 0.0
    assert time_left(None, 1, 4) is None and time_left(5.0, 0, 4) is None and time_left(5.0, 1, None) is None


def test_phases_and_parts_name_the_overall_bar_and_move_it(terminal):
    screen, opened = terminal
    with overall_progress(3) as overall:
        assert overall is opened[0] and overall.total == 3 and overall.completed == 0
        phase("arm 1 of 2", {"a1-stage1": "stage 1 of 2", "a1-stage2": "stage 2 of 2", "a1-head": "head"})
        run_loop("a1-stage1", 4, transient=False)
        assert overall.completed == pytest.approx(1 / 3)          # one of the phase's three parts
        with progress_bar(True) as bar:
            task = bar.add_task("a1-stage2", total=4)
            bar.advance(task, 2)
            assert overall.completed == pytest.approx((1 + 0.5) / 3)
        phase("arm 2 of 2", {"a2-stage1": "stage 1 of 2", "a2-stage2": "stage 2 of 2", "a2-head": "head"})
        run_loop("a2-stage2", 4)                                   # stage 1 resumed: it drew no bar
        assert overall.completed == pytest.approx(1 + 2 / 3)
        phase("scratch baseline")
        run_loop("scratch", 5, stop_at=4)                          # stopped early by its own rule
        assert overall.completed == pytest.approx(2 + 4 / 5)
    assert overall.history == ["arm 1 of 2", "stage 1 of 2 · arm 1 of 2", "stage 2 of 2 · arm 1 of 2",
                               "arm 2 of 2", "stage 2 of 2 · arm 2 of 2", "scratch baseline"]
    assert not progress._ACTIVE                                    # closed: bars are on their own again
    text = screen.getvalue()
    assert "a1-stage1" in text                                     # a bar that is not transient stays printed


def test_more_phases_than_announced_stretch_the_bar(terminal):
    _, opened = terminal
    with overall_progress(1):
        phase("one")
        phase("two")
    assert opened[0].total == 2 and opened[0].completed == 1


def test_without_a_terminal_nothing_is_drawn_and_phase_is_a_no_op():
    with overall_progress(3) as overall:         # pytest's stderr is not a terminal
        assert overall is None
        phase("arm 1 of 1")                      # no error, nothing to do
        bar = progress_bar(True)
        assert not isinstance(bar, progress._Nested) and bar.disable


def test_disabled_runs_open_no_overall_bar(terminal):
    _, opened = terminal
    with overall_progress(2, enabled=False) as overall:
        assert overall is None
    with overall_progress(2) as outer, overall_progress(5) as inner:   # one overall bar at a time
        assert outer is not None and inner is None
    assert len(opened) == 1


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*(at chance|reached the tolerance)")   # untrained models, 2 IRI steps
def test_stitch_names_seed_pair_arm_objective_and_counts_its_phases(terminal, data_spec):
    from simkit.data import load_data
    from simkit.models import load_model
    from simkit.stitching import StitchSettings, stitch

    _, opened = terminal
    spec = "simkit:cnn2d:channels=4,layers=2"
    settings = StitchSettings(layer_a=["blocks.0", "blocks.1"], layer_b=["blocks.1", "blocks.1"],
                              objective=["dm", "fula"], iri=True, steps=2, iri_steps=2, iri_restarts=0,
                              batch_size=32, n=120, train=0.1, seeds=2)
    stitch(lambda seed: load_model(spec, seed=seed), lambda seed: load_model(spec, seed=seed + 1),
           load_data(data_spec, n=120), settings, cache_dir=None, progress=True)
    overall = opened[0]
    # per seed: train A, train B, IRIs of blocks.0 and blocks.1, 2 pairs × 2 arms × 2 objectives
    assert overall.total == 2 * (2 + 2 + 8) and overall.index + 1 == overall.total
    shown = overall.history
    for seed in (1, 2):
        for label in ("training A", "training B", "IRIs of A.blocks.0", "IRIs of A.blocks.1"):
            assert f"{label} · seed {seed} of 2" in shown
        for pair in (1, 2):
            for arm in ("standard", "iri"):
                for k, objective in enumerate(("dm", "fula"), 1):
                    assert f"objective {k} of 2 ({objective}) · {arm} arm · pair {pair} of 2 · seed {seed} of 2" \
                        in shown
    assert 0 < overall.completed <= overall.total


@pytest.mark.slow
def test_convert_names_stage_and_arm_and_counts_its_phases(terminal):
    from simkit.conversion import ConvertSettings, convert
    from simkit.data import load_data
    from simkit.models import load_model

    _, opened = terminal
    settings = ConvertSettings(recipe="conv-to-mlp", rank=8, steps_per_stage=2, finetune_epochs=0.2,
                               head_epochs=0.2, batch_size=64, train_guide=0.2, n=240, baseline_epochs=0.2,
                               baselines=["scratch", "kd"], schedule=["progressive", "joint"])
    result = convert(load_model("simkit:cnn2d:channels=4,layers=2"), load_data("digits"), settings, progress=True)
    overall = opened[0]
    assert overall.total == 1 + 2 + 1 + 1 and overall.index + 1 == overall.total   # guide, 2 arms, kd, scratch
    stages = result.tables["stage_summary"]
    shown = overall.history
    for number, schedule in enumerate(("progressive", "joint"), 1):
        names = list(stages.loc[stages["schedule"] == schedule, "stage"])
        for k in range(1, len(names) + 1):
            assert f"stage {k} of {len(names)} · arm {number} of 2" in shown
        assert f"head · arm {number} of 2" in shown and f"fine-tuning · arm {number} of 2" in shown
    assert shown[0] == "guide training"
    assert shown[-2:] == ["kd baseline (guide trained)", "scratch baseline"]
