"""Kill a real training run and resume it: the result must not know (issue #15).

For every training command (convert, stitch, linearize, graft) a real subprocess is
- SIGKILLed once its first checkpoint is written, then resumed, and its resumed run SIGKILLed again
  after the next checkpoint, then resumed to the end (``chain``);
- SIGKILLed later, after its second checkpoint, then resumed (``later``);
- sent SIGTERM in the middle of a stage (the loop checkpoints the current step and exits 143), then
  resumed (``sigterm``);
and every time the final ``result.json`` summary and every CSV are bit-identical to those of an
uninterrupted run (timing columns left out). Each run has several training stages (convert: two
alignment stages, head, fine-tuning; stitch: three objectives; linearize: pre-training and two ω;
graft: three E2 arms) so that kills land between and inside them. The subprocesses run through a tiny
launcher that sleeps after every optimizer step (``SIMKIT_TEST_STEP_DELAY``) so that a kill lands
mid-run on any machine; sleeping changes no number. graft's F3 (itself a kill-and-resume of a worker
process) is replaced by a constant stub in these processes, to keep the module affordable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import is_timing, without_timings

CNN = "simkit:cnn2d:channels=4,layers=2"
COMMANDS = {
    "convert": ["convert", CNN, "--data", "digits", "--n", "300", "--rank", "8", "--steps-per-stage", "12",
                "--finetune-epochs", "2", "--batch-size", "64", "--baselines", "none", "--no-report"],
    "stitch": ["stitch", CNN, CNN, "--data", "digits", "--n", "200", "--steps", "12", "--batch-size", "32",
               "--layer-a", "blocks.0", "--layer-b", "blocks.0", "--objective", "fula,dm,slm", "--no-report"],
    "linearize": ["linearize", CNN, "--data", "digits", "--n", "300", "--epochs", "3", "--train", "2",
                  "--omega", "1e-2,1e-1", "--granularity", "layer", "--batch-size", "64", "--no-cka",
                  "--no-report"],
    "graft": ["graft", "simkit:llama:d=16,blocks=2", "--steps", "12", "--n", "16", "--batch-size", "8",
              "--no-report"],
}
DELAY = "0.04"  # seconds of sleep after each optimizer step in the launched processes
LAUNCHER = '''
import os, sys, time
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

delay = float(os.environ.get("SIMKIT_TEST_STEP_DELAY", "0"))
if delay:
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: time.sleep(delay))
import pandas as pd
import simkit.grafting.experiments as experiments


def f3_stub(task, s, out, timeout=1800.0):
    return pd.DataFrame({"step": [1], "loss_uninterrupted": [0.0], "loss_killed_resumed": [0.0]}), {
        "f3_resume_bit_identical": True, "f3_without_moments_diverges_at_step": None}


experiments.run_f3 = f3_stub
from simkit.cli.main import main

sys.argv = ["simkit", *sys.argv[1:]]
main()
'''
def outcome(out: Path) -> dict[str, object]:
    """The summary and every CSV (timing columns dropped) of a finished run directory."""
    result = {"summary": without_timings(json.loads((out / "result.json").read_text())["summary"])}
    for csv in sorted(out.glob("*.csv")):
        frame = pd.read_csv(csv, keep_default_na=False)
        result[csv.name] = frame.drop(columns=[c for c in frame.columns if is_timing(str(c))]).to_csv(index=False)
    return result


def checkpoints(out: Path) -> int:
    folder = out / "checkpoints"
    return len([p for p in folder.glob("*.pt") if not p.name.startswith(".")]) if folder.is_dir() else 0


def mid_stage(out: Path) -> bool:
    """True while a training stage without a checkpoint has logged a few steps (its loop is running)."""
    folder = out / "checkpoints"
    done = {p.name[:-3] for p in folder.glob("*.pt")} if folder.is_dir() else set()
    for log in out.glob("*.log.csv"):
        if log.name[:-len(".log.csv")] not in done and len(log.read_text().splitlines()) >= 3:
            return True
    return False


class Launch:
    def __init__(self, tmp: Path):
        self.launcher = tmp / "launch.py"
        self.launcher.write_text(LAUNCHER)
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                    "SIMKIT_TEST_STEP_DELAY": DELAY, "COLUMNS": "120"}

    def start(self, args: list[str], out: Path, resume: bool = False) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(self.launcher), *args, "--out", str(out),
                                 *(["--resume"] if resume else [])],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, args: list[str], out: Path, resume: bool = False) -> None:
        proc = self.start(args, out, resume)
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]

    def interrupt(self, args: list[str], out: Path, *, after: int, sig: int = signal.SIGKILL,
                  wait: float = 0.0, resume: bool = False, inside: bool = False) -> int:
        """Start the command, send ``sig`` once ``out`` holds ``after`` checkpoints (and, with ``inside``,
        a later stage is running; then ``wait`` s more); returns the exit code. The run must not have
        finished by then."""
        proc = self.start(args, out, resume)
        deadline = time.monotonic() + 600
        while checkpoints(out) < after or inside and not mid_stage(out):
            if proc.poll() is not None:
                raise AssertionError(f"finished before {after} checkpoints: {proc.stderr.read()[-3000:]}")
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(wait)
        assert proc.poll() is None, "the run finished before it could be interrupted; raise its steps"
        proc.send_signal(sig)
        proc.communicate(timeout=120)
        assert not (out / "result.json").exists()
        return proc.returncode


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> Launch:
    return Launch(tmp_path_factory.mktemp("launcher"))


@pytest.fixture(scope="module")
def reference(launch, tmp_path_factory):
    """command → the outcome of an uninterrupted run (made once per module)."""
    made: dict[str, dict[str, object]] = {}

    def get(name: str) -> dict[str, object]:
        if name not in made:
            out = tmp_path_factory.mktemp(f"uninterrupted-{name}") / "run"
            launch.run(COMMANDS[name], out)
            made[name] = outcome(out)
        return made[name]

    return get


def assert_same(reference: dict[str, object], out: Path) -> None:
    got = outcome(out)
    assert sorted(got) == sorted(reference)
    for key in reference:
        assert got[key] == reference[key], key


@pytest.mark.parametrize("name", list(COMMANDS))
def test_killed_after_first_checkpoint_and_again_while_resuming(name, launch, reference, tmp_path):
    out, args = tmp_path / "run", COMMANDS[name]
    assert launch.interrupt(args, out, after=1) == -signal.SIGKILL
    assert launch.interrupt(args, out, after=2, resume=True) == -signal.SIGKILL  # the resumed run, killed too
    launch.run(args, out, resume=True)
    assert_same(reference(name), out)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMMANDS))
def test_killed_later(name, launch, reference, tmp_path):
    out, args = tmp_path / "run", COMMANDS[name]
    assert launch.interrupt(args, out, after=2, wait=0.15) == -signal.SIGKILL
    launch.run(args, out, resume=True)
    assert_same(reference(name), out)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMMANDS))
def test_sigterm_mid_stage(name, launch, reference, tmp_path):
    out, args = tmp_path / "run", COMMANDS[name]
    # graft checkpoints its arms every few steps, so its first checkpoint is already mid-arm; the others
    # checkpoint at the end of a stage, so wait until a later stage is logging steps.
    # Exit code 143 is the loop's own (it checkpointed, then stopped): outside a loop SIGTERM would kill.
    code = launch.interrupt(args, out, after=1, sig=signal.SIGTERM, inside=name != "graft", wait=0.05)
    assert code == 128 + signal.SIGTERM
    launch.run(args, out, resume=True)
    assert_same(reference(name), out)
