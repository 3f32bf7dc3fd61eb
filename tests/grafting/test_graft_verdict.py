"""The graft suite's verdict (e1_pass … all_pass, verdict), its report's findings and cautions, and the
speed-related parts of the suite that change no check: thread scoping, E3's warm-up, F3's stage split,
the probe size."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import typer

from simkit.cli.main import app
from simkit.errors import SimkitError
from simkit.grafting import GraftSettings, experiments
from simkit.grafting.tasks import E1_MIN_VALUES, make_task, probe_size
from simkit.grafting.verdict import E3_MIN_CORRELATION, verdict
from simkit.models import load_model
from simkit.report.graft import cautions, findings
from simkit.results import GraftResult

PASSING = {
    "e1_values_compared": 12800, "e1_mismatches": 0, "e1_site_mismatches": 0,
    "e2_shadow_alpha_first_grad_step": 1, "e2_shadow_branch_first_grad_step": 2,
    "e2_net2net_alpha_first_grad_step": 2, "e2_net2net_branch_first_grad_step": 1,
    "e2_double_zero_max_abs_grad": 0.0, "e2_steps": 600, "e3_cone_cost_correlation": 0.997, "e3_sites": 5,
    "f3_resume_bit_identical": True, "f3_without_moments_diverges_at_step": 452, "f3_graft_at_step": 300,
    "f3_killed_after_step": 451, "f3_resumed_from_step": 450,
}
# one change per row, the check it must fail (and no other)
BREAKS = [
    ({"e1_mismatches": 1}, "e1"), ({"e1_site_mismatches": 3}, "e1"), ({"e1_values_compared": 0}, "e1"),
    ({"e2_shadow_alpha_first_grad_step": 2}, "e2"), ({"e2_shadow_alpha_first_grad_step": None}, "e2"),
    ({"e2_shadow_branch_first_grad_step": 1}, "e2"), ({"e2_net2net_branch_first_grad_step": 2}, "e2"),
    ({"e2_double_zero_max_abs_grad": 1e-30}, "e2"),
    ({"e3_cone_cost_correlation": E3_MIN_CORRELATION - 1e-9}, "e3"), ({"e3_cone_cost_correlation": math.nan}, "e3"),
    ({"f3_resume_bit_identical": False}, "f3"), ({"f3_without_moments_diverges_at_step": None}, "f3"),
]


def test_a_passing_summary_passes_every_check():
    v = verdict(PASSING)
    assert {k: v[k] for k in ("e1_pass", "e2_pass", "e3_pass", "f3_pass", "all_pass")} == dict.fromkeys(
        ("e1_pass", "e2_pass", "e3_pass", "f3_pass", "all_pass"), True)
    assert v["verdict"] == "E1, E2, E3, F3 pass"
    assert verdict({**PASSING, "e3_cone_cost_correlation": E3_MIN_CORRELATION})["e3_pass"] is True


@pytest.mark.parametrize("change, check", BREAKS)
def test_each_broken_claim_fails_its_check_alone(change, check):
    v = verdict({**PASSING, **change})
    assert v[f"{check}_pass"] is False and v["all_pass"] is False
    assert all(v[f"{c}_pass"] for c in ("e1", "e2", "e3", "f3") if c != check)
    assert f"{check.upper()} fails (" in v["verdict"] and v["verdict"].count("fails") == 1


def test_missing_keys_fail_and_other_gates_count_for_e1():
    v = verdict({})
    assert not any(v[k] for k in ("e1_pass", "e2_pass", "e3_pass", "f3_pass", "all_pass"))
    assert v["verdict"].startswith("E1 fails (")
    assert verdict(PASSING, e1_mismatches=[0, 0, 2, 0])["e1_pass"] is False  # the net2net row's site bits
    assert verdict(PASSING, e1_mismatches=[0, 0, 0, 0])["e1_pass"] is True
    low = verdict({**PASSING, "e3_cone_cost_correlation": 0.412})
    assert low["verdict"] == f"E1, E2, F3 pass; E3 fails (cone-cost correlation 0.412 < {E3_MIN_CORRELATION})"


def result(summary, e3=None, steps=600):
    summary = {**summary, **verdict(summary)}
    settings = {"model": "simkit:llama", "gate": "shadow", "branch": "llama", "after": "blocks.1", "steps": steps}
    return GraftResult(summary=summary, tables={"e1": pd.DataFrame({"gate": ["shadow"], "mismatches": [0]}),
                                                **({"e3": e3} if e3 is not None else {})},
                       meta={"settings": settings})


def test_findings_lead_with_the_verdict_then_the_measured_values():
    r = result(PASSING)
    lines = findings(r.summary, r.meta["settings"])
    assert len(lines) == 3
    assert lines[0] == ("graft on simkit:llama (shadow gate, llama branch after blocks.1, 600 steps): "
                        "E1, E2, E3, F3 pass.")
    assert "changed 0 of 12800 output values' bits" in lines[1] and "at step 1 and its branch at step 2" in lines[1]
    assert "exactly zero" in lines[1]
    assert "correlates at 0.997 over 5 graft depths" in lines[2] and "bit-identical to the uninterrupted" in lines[2]
    assert "diverges at step 452" in lines[2]
    assert cautions(r.summary, []) == []
    bad = result({**PASSING, "f3_resume_bit_identical": False, "e3_cone_cost_correlation": 0.2})
    lines = findings(bad.summary, bad.meta["settings"])
    assert "E1, E2 pass; E3 fails (cone-cost correlation 0.200" in lines[0] and "F3 fails (resume bit-identical: False" in lines[0]
    assert "is not bit-identical to" in lines[2]
    assert findings({"e1_mismatches": 0}, {}) == []  # an old result without the verdict


def test_cautions_say_what_to_distrust():
    e3 = [{"site": "embed", "recompute_s": 0.020, "full_forward_s": 0.018},      # the whole net + graft: fine
          {"site": "blocks.0", "recompute_s": 0.019, "full_forward_s": 0.018},
          {"site": "blocks.1", "recompute_s": 0.004, "full_forward_s": 0.018}]
    summary = {**PASSING, "e2_steps": 40, "e3_cone_cost_correlation": 0.5, "e1_note": "E1 compared only 240"}
    summary.update(verdict(summary))
    out = cautions(summary, e3)
    assert out[0] == "E1 compared only 240"
    assert "ran 40 steps, fewer than the paper's 600" in out[1]
    assert "wall-clock timings" in out[2] and "below the pass threshold" in out[2]
    assert "after blocks.0 took 0.019 s, more than a full forward pass (0.018 s), at 1 of the 2" in out[3]
    assert len(out) == 4
    note = {**PASSING, "e3_cone_cost_correlation": math.nan, "e3_note": "torch.fx cannot trace it"}
    note.update(verdict(note))
    assert cautions(note, []) == ["E3 was not measured: torch.fx cannot trace it"]


def test_torch_threads_is_scoped():
    before = torch.get_num_threads()
    with experiments.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(KeyError), experiments.torch_threads(1):
        raise KeyError("x")
    assert torch.get_num_threads() == before


def test_best_time_warms_up_then_keeps_the_fastest(monkeypatch):
    calls = []
    clock = iter([0.0, 1.0, 10.0, 10.5, 20.0, 20.25])  # perf_counter around the 3 timed calls

    monkeypatch.setattr(experiments.time, "perf_counter", lambda: next(clock))
    assert experiments._best_time(lambda: calls.append(1), repeats=3) == 0.25
    assert len(calls) == 4  # one untimed warm-up call, then the three timed ones


@pytest.mark.parametrize("steps", range(6, 41))
def test_f3_resume_always_leaves_two_steps_for_the_moments(steps):
    cfg1, cfg2, hang = experiments.f3_configs(GraftSettings(steps=steps))
    s1, s2, every = cfg1.steps, cfg2.steps, cfg2.checkpoint_every
    assert s1 + s2 == steps and s1 >= 2 and s1 == min(steps // 2, steps - 4)
    resumed = hang // every * every  # the checkpoint the killed worker left
    assert 1 <= hang < s2 and hang % every != 0 and resumed >= every
    assert resumed + 2 <= s2, "the second step after the resume is the first whose loss the moments change"


def test_probe_reaches_the_papers_1600_values_when_the_data_has_them():
    assert probe_size(10) == 160 and probe_size(50) == 64 and probe_size(1) == E1_MIN_VALUES
    s = GraftSettings(model="simkit:cnn1d:channels=4,layers=2", after="blocks.0", steps=6, n=300).resolved(False)
    from simkit.data import load_data

    task = make_task(s, load_model(s.model), load_data("synthetic:1x40", n=300))
    assert task.probe.shape[0] == 160
    llama = GraftSettings(seq_len=2, n=40).resolved(True)  # 8 sequences × 2 tokens × 50 would be 800 values
    task = make_task(llama, load_model("simkit:llama:d=16,blocks=1"), None)
    assert task.probe.shape == (16, 2) and task.probe.numel() * 50 >= E1_MIN_VALUES


def test_every_flag_the_suite_names_exists():
    """Every --flag written in the suite's messages, notes, report and help is an option of `simkit graft`."""
    import re
    from pathlib import Path

    import simkit

    flags = {opt for p in typer.main.get_command(app).commands["graft"].params for opt in p.opts}
    root = Path(simkit.__file__).parent
    sources = [*sorted((root / "grafting").glob("*.py")), *sorted((root / "surgery").glob("*.py")),
               root / "report" / "graft.py", root.parent / "cli" / "graft.py",
               root.parent / "reports" / "templates" / "graft.html.j2"]
    named = {flag for path in sources for flag in re.findall(r"--[a-z][a-z-]*", path.read_text())}
    assert "--n" in named and named <= flags, named - flags
    note = experiments.e1_shortfall(240, 24)
    assert note is not None and "`n` (--n)" in note


def test_the_suite_runs_with_its_threads_and_gives_the_callers_back(tmp_path, monkeypatch):
    """E1–F3 run with ``settings.threads`` torch threads; the caller's count is restored, also after an
    error; meta records the threads and each check's CPU seconds; the summary carries the verdict."""
    from simkit.grafting import graft

    seen = []

    def stub(result):
        def run(*args, **kwargs):
            seen.append(torch.get_num_threads())
            return result
        return run

    monkeypatch.setattr(experiments, "run_e2", stub((pd.DataFrame(), pd.DataFrame(), {})))
    monkeypatch.setattr(experiments, "run_e3", stub((pd.DataFrame(), {})))
    monkeypatch.setattr(experiments, "run_f3", stub((pd.DataFrame(), {"f3_resume_bit_identical": True})))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        r = graft(load_model("simkit:llama:d=16,blocks=2"), None, GraftSettings(steps=6, n=16, seq_len=8),
                  run_dir=tmp_path / "run", progress=False)
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
        assert r.meta["threads"] == 1 and r.meta["settings"]["threads"] == 1
        assert set(r.meta["cpu_seconds"]) == {"e1", "e2", "e3", "f3"}
        assert r.summary["e1_pass"] is True and r.summary["all_pass"] is False
        assert r.summary["verdict"].startswith("E1 pass; E2 fails (")
        monkeypatch.setattr(experiments, "run_e3", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            graft(load_model("simkit:llama:d=16,blocks=2"), None, GraftSettings(steps=6, n=16, seq_len=8),
                  progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SimkitError, match="`threads` must be a positive integer, got 0"):
        GraftSettings(threads=0).validate()
