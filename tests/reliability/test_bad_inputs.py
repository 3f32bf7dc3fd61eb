"""A catalogue of bad inputs across every command, tried as a new user would (issue #15).

Each case runs through typer's CliRunner (in-process, fast) and must end with exit code 2, exactly one
line of output, no traceback, and — where the case points ``--out`` at an earlier good run — that run's
files byte-identical with the same mtimes (or, for a fresh ``--out``, nothing created). A sample of the
cases also runs as a real subprocess (`python -m simkit.cli.main`), where a traceback printed by the
process itself would show. Tiny models and data: the module runs in seconds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers import invoke

pytestmark = pytest.mark.usefixtures("one_thread")

CNN = "simkit:cnn2d:channels=4,layers=2"
MLP = "simkit:mlp:in_features=64,hidden=8,depth=2,num_classes=10"
LLAMA = "simkit:llama:d=16,blocks=2"
GOOD = {
    "convert": ["convert", CNN, "--data", "digits", "--n", "300", "--rank", "8", "--steps-per-stage", "3",
                "--finetune-epochs", "1", "--batch-size", "64", "--baselines", "none", "--no-report"],
    "stitch": ["stitch", CNN, CNN, "--data", "digits", "--n", "120", "--steps", "4", "--batch-size", "32",
               "--layer-a", "blocks.0", "--layer-b", "blocks.0", "--objective", "fula", "--no-report"],
    "linearize": ["linearize", CNN, "--data", "digits", "--n", "200", "--epochs", "1", "--omega", "1e-2",
                  "--granularity", "layer", "--batch-size", "64", "--no-cka", "--no-report"],
    "graft": ["graft", LLAMA, "--steps", "6", "--n", "16", "--batch-size", "8", "--no-report"],
    "capture": ["capture", CNN, "--data", "digits", "--n", "64"],
    "compare": ["compare", CNN, CNN, "--data", "digits", "--n", "64", "--no-report"],
}
ODD_MODEL = '''
from torch import nn


class Odd(nn.Module):
    """A small CNN for 8x8 digits whose module names torch.fx cannot print as Python."""

    def __init__(self):
        super().__init__()
        self.add_module('conv"1', nn.Conv2d(1, 4, 3, padding=1))
        self.add_module("act 1", nn.ReLU())
        self.add_module('conv"2', nn.Conv2d(4, 4, 3, padding=1))
        self.add_module("act-2", nn.ReLU())
        self.add_module("pool", nn.AdaptiveAvgPool2d(1))
        self.add_module("flat", nn.Flatten())
        self.add_module("head", nn.Linear(4, 10))

    def forward(self, x):
        for module in self.children():
            x = module(x)
        return x


def build():
    return Odd()


class Split(nn.Module):
    def forward(self, x):
        return x, 2 * x


class Pair(nn.Module):
    """A module with a tuple output (``split``), for --output-index."""

    def __init__(self):
        super().__init__()
        self.split = Split()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.split(x)[1])


def pair():
    return Pair()
'''


@dataclass(frozen=True)
class Case:
    """One bad input: ``args`` with ``{f}`` for the folder of prepared files; ``out``: ``"earlier"``
    (a copy of an earlier good run of the same command, which must stay untouched), ``"new"`` (a fresh
    path: nothing may be created), a path template, or None (the command takes no --out); ``says``: a
    piece of the one line."""

    id: str
    args: tuple[str, ...]
    says: str
    out: str | None = "earlier"


def case(id, args, says, out="earlier"):
    return pytest.param(Case(id, tuple(args), says, out), id=id)


def good(name, *extra, drop=()):
    """The good arguments of ``name`` with options in ``drop`` (flag → removed with its value) taken
    out and ``extra`` appended."""
    args, out = list(GOOD[name]), []
    i = 0
    while i < len(args):
        if args[i] in drop:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return [*out, *extra]


LONG = "x" * 300
CASES = [
    # --- convert
    case("convert-batch-size-negative", good("convert", "--batch-size", "-1"), "--batch-size"),
    case("convert-batch-size-zero", good("convert", "--batch-size", "0"), "--batch-size"),
    case("convert-steps-negative", good("convert", "--steps-per-stage", "-3"), "--steps-per-stage"),
    case("convert-finetune-negative", good("convert", "--finetune-epochs", "-1"), "--finetune-epochs"),
    case("convert-rank-zero", good("convert", "--rank", "0"), "--rank"),
    case("convert-lr-nan", good("convert", "--lr", "nan"), "--lr"),
    case("convert-lr-negative", good("convert", "--lr", "-1"), "--lr"),
    case("convert-finetune-infinite", good("convert", "--finetune-epochs", "inf"), "--finetune-epochs"),
    case("convert-nan-inputs", good("convert", "--data", "npy:{f}/nan_late.npy,labels={f}/y.npy"), "NaN"),
    case("convert-recipe-typo", good("convert", "--recipe", "conv-to-mpl"), "conv-to-mlp"),
    case("convert-schedule-typo", good("convert", "--schedule", "progresive"), "progressive"),
    case("convert-metric-typo", good("convert", "--metric", "cak"), "cka"),
    case("convert-baseline-typo", good("convert", "--baselines", "scrach"), "scratch"),
    case("convert-guide-init-typo", good("convert", "--guide-init", "trainde"), "trained"),
    case("convert-data-typo", good("convert", "--data", "digts"), "digits"),
    case("convert-n-zero", good("convert", "--n", "0"), "--n"),
    case("convert-steps-per-stage-word", good("convert", "--steps-per-stage", "many"), "--steps-per-stage"),
    case("convert-stop-loss-word", good("convert", "--stop-loss", "low"), "--stop-loss"),
    case("convert-val-fraction-too-big", good("convert", "--val-fraction", "0.95"), "--val-fraction"),
    case("convert-guide-missing-file", ["convert", "file:{f}/missing.pt", *good("convert")[2:]], "does not exist"),
    case("convert-guide-random-bytes", ["convert", "file:{f}/random.pt", *good("convert")[2:]],
         "random.pt' is not a model file simkit can read"),  # not "a pickled object, pass --trust"
    case("convert-guide-random-bytes-trust", ["convert", "file:{f}/random.pt", *good("convert")[2:], "--trust"],
         "random.pt' is not a model file simkit can read"),
    case("convert-plan-missing", good("convert", "--plan", "{f}/noplan.py:make"), "noplan.py"),
    case("convert-out-is-a-file", good("convert"), "is an existing file", out="{f}/afile"),
    case("convert-out-under-a-file", good("convert"), "which is a file", out="{f}/afile/run"),
    case("convert-out-name-too-long", good("convert"), "too long", out="new/" + LONG),
    case("convert-resume-nothing-there", good("convert", "--resume"), "does not exist", out="new"),
    case("convert-resume-changed", good("convert", "--resume", "--rank", "4", drop=("--rank",)), "rank: 8 → 4"),
    case("convert-device-typo", good("convert", "--device", "gpu"), "gpu"),
    # --- stitch
    case("stitch-layer-typo", good("stitch", "--layer-a", "blocks.9", drop=("--layer-a",)), "blocks.9"),
    case("stitch-objective-typo", good("stitch", "--objective", "hml", drop=("--objective",)), "hlm"),
    case("stitch-steps-negative", good("stitch", "--steps", "-1"), "--steps"),
    case("stitch-batch-size-zero", good("stitch", "--batch-size", "0"), "--batch-size"),
    case("stitch-lr-negative", good("stitch", "--lr", "-1"), "--lr"),
    case("stitch-iri-tol-negative", good("stitch", "--iri", "--iri-tol", "-1"), "--iri-tol"),
    case("stitch-nan-inputs", good("stitch", "--data", "npy:{f}/nan.npy,labels={f}/y.npy"), "NaN"),
    case("stitch-nan-held-out", good("stitch", "--data", "npy:{f}/nan_late.npy,labels={f}/y.npy"), "NaN"),
    case("stitch-hlm-without-labels", good("stitch", "--data", "synthetic:1x8x8", "--objective", "hlm",
                                           drop=("--objective",)), "labels"),
    case("stitch-iri-step-size-negative", good("stitch", "--iri", "--iri-step-size", "-1"), "--iri-step-size"),
    case("stitch-lr-infinite", good("stitch", "--lr", "inf"), "--lr"),
    case("stitch-data-does-not-fit", good("stitch", "--data", "mnist1d"), "--data"),
    case("stitch-model-b-random-bytes-trust", ["stitch", CNN, "file:{f}/random.pt", *good("stitch")[3:], "--trust"],
         "random.pt"),
    case("stitch-model-truncated-pickle-trust",
         ["stitch", "file:{f}/pickled_trunc.pt", CNN, *good("stitch")[3:], "--trust"],
         "pickled_trunc.pt' is a truncated or corrupt torch file"),
    case("stitch-model-pickled-without-trust", ["stitch", "file:{f}/pickled.pt", CNN, *good("stitch")[3:]],
         "is a pickled object and loading it executes code from the file; pass --trust"),
    case("stitch-resume-truncated-checkpoint", good("stitch", "--resume"), "is truncated or corrupt",
         out="earlier+truncated-checkpoint"),
    case("stitch-resume-changed", good("stitch", "--resume", "--seed", "2"), "seed: 0 → 2"),
    case("stitch-train-negative", good("stitch", "--train", "-1"), "--train"),
    case("stitch-test-data-does-not-fit", good("stitch", "--test-data", "mnist1d"), "--test-data"),
    case("stitch-iri-restarts-negative", good("stitch", "--iri", "--iri-restarts", "-1"), "--iri-restarts"),
    # --- linearize
    case("linearize-omega-not-a-number", good("linearize", "--omega", "abc", drop=("--omega",)), "--omega"),
    case("linearize-omega-negative", good("linearize", "--omega", "-1", drop=("--omega",)), "--omega"),
    case("linearize-granularity-typo", good("linearize", "--granularity", "chanel", drop=("--granularity",)),
         "channel"),
    case("linearize-epochs-negative", good("linearize", "--epochs", "-1"), "--epochs"),
    case("linearize-epochs-infinite", good("linearize", "--epochs", "inf"), "--epochs"),
    case("linearize-lr-negative", good("linearize", "--lr", "-1"), "--lr"),
    case("linearize-batch-size-zero", good("linearize", "--batch-size", "0"), "--batch-size"),
    case("linearize-seeds-zero", good("linearize", "--seeds", "0"), "--seeds"),
    case("linearize-nan-held-out", good("linearize", "--data", "npy:{f}/nan_late.npy,labels={f}/y.npy"), "NaN"),
    case("linearize-weights-random-bytes", good("linearize", "--weights", "{f}/random.pt"), "random.pt"),
    case("linearize-weights-truncated", good("linearize", "--weights", "{f}/trunc.pt"),
         "trunc.pt' is a truncated or corrupt torch file"),
    case("linearize-resume-random-checkpoint", good("linearize", "--resume"), "is truncated or corrupt",
         out="earlier+random-checkpoint"),
    case("linearize-weights-wrong-architecture", good("linearize", "--weights", "{f}/linear.pt"), "do not fit"),
    case("linearize-out-name-too-long", good("linearize"), "too long", out="new/" + LONG),
    case("linearize-out-under-a-file", good("linearize"), "which is a file", out="{f}/afile/run"),
    case("linearize-no-labels", good("linearize", "--data", "synthetic:1x8x8"), "labels"),
    # --- graft
    case("graft-n-zero", good("graft", "--n", "0"), "--n"),
    case("graft-steps-zero", good("graft", "--steps", "0"), "--steps"),
    case("graft-batch-size-zero", good("graft", "--batch-size", "0"), "--batch-size"),
    case("graft-after-typo", good("graft", "--after", "blocks.7"), "blocks.7"),
    case("graft-double-zero-not-allowed", good("graft", "--gate", "double_zero"), "--allow-double-zero"),
    case("graft-model-without-data", ["graft", CNN, "--after", "blocks.0", "--steps", "6", "--n", "16",
                                      "--no-report"], "--data"),
    case("graft-nan-inputs", ["graft", CNN, "--after", "blocks.0", "--data", "npy:{f}/nan.npy,labels={f}/y.npy",
                              "--steps", "6", "--n", "16", "--no-report"], "NaN", out="new"),
    case("graft-after-typo-user-model", ["graft", CNN, "--after", "blocks.9", "--data", "digits", "--steps", "6",
                                         "--n", "16", "--no-report"], "blocks.9", out="new"),
    case("graft-resume-changed", good("graft", "--resume", "--seed", "3"), "seed: 0 → 3"),
    case("graft-resume-truncated-checkpoint", good("graft", "--resume"), "is truncated or corrupt",
         out="earlier+truncated-checkpoint"),
    case("convert-resume-truncated-checkpoint", good("convert", "--resume"), "is truncated or corrupt",
         out="earlier+truncated-checkpoint"),
    # --- capture
    case("capture-layer-typo", good("capture", "--layers", "blocks.9"), "blocks.9"),
    case("capture-batch-size-zero", good("capture", "--batch-size", "0"), "--batch-size"),
    case("capture-data-does-not-fit", good("capture", "--data", "mnist1d"), "--data"),
    case("capture-reduce-typo", good("capture", "--reduce", "meen"), "mean"),
    case("capture-out-is-a-file", good("capture"), "is an existing file", out="{f}/afile"),
    case("capture-out-under-a-file", good("capture"), "which is a file", out="{f}/afile/cache"),
    case("capture-out-name-too-long", good("capture"), "too long", out="new/" + LONG),
    case("capture-model-random-bytes-trust", ["capture", "file:{f}/random.pt", *good("capture")[2:], "--trust"],
         "random.pt"),
    # --- compare
    case("compare-out-is-a-file", good("compare"), "is an existing file", out="{f}/afile"),
    case("compare-out-under-a-file", good("compare"), "which is a file", out="{f}/afile/run"),
    case("compare-out-name-too-long", good("compare"), "too long", out="new/" + LONG),
    case("compare-metric-typo", good("compare", "--metric", "linear_cak"), "linear_cka"),
    case("compare-binary-text-file", ["compare", LLAMA, LLAMA, "--data", "text:{f}/binary.txt,tokenizer=bytes",
                                      "--no-report"], "binary.txt"),
    case("compare-cache-corrupt-manifest", ["compare", "{f}/cache_bad_manifest", "{f}/cache", "--no-report"],
         "manifest.json"),
    case("compare-cache-missing-shard", ["compare", "{f}/cache_no_shard", "{f}/cache", "--no-report"], "shard"),
    case("compare-output-index-out-of-range", ["compare", "python:oddmodels:pair", "python:oddmodels:pair",
                                               "--data", "digits", "--n", "32", "--layers-a", "split",
                                               "--layers-b", "split", "--output-index", "5", "--no-report"],
         "5 is out of range of a tuple of 2 (indices 0 to 1)"),
    case("compare-model-foreign-zip-trust", ["compare", "file:{f}/foreign.pt", CNN, *good("compare")[3:], "--trust"],
         "foreign.pt' is a zip archive but not a torch.save file"),
    case("compare-model-truncated-state-dict", ["compare", "file:{f}/trunc.pt", CNN, *good("compare")[3:]],
         "trunc.pt' is a truncated or corrupt torch file"),  # not "a pickled object"
    # --- escapes found by issue #25
    case("compare-out-name-too-long-existing-parent", good("compare"), "too long", out="{f}/" + LONG),
    case("linearize-out-name-too-long-existing-parent", good("linearize"), "too long", out="{f}/" + LONG),
    case("compare-model-pickle-calls-os-system", ["compare", "file:{f}/evil_system.pt", CNN, *good("compare")[3:]],
         "evil_system.pt' holds code: unpickling it would call posix.system (os.system), so simkit will not "
         "load it; --trust would run that code"),
    case("layers-model-pickle-calls-eval", ["layers", "file:{f}/evil_eval.pt"],
         "evil_eval.pt' holds code: unpickling it would call eval", out=None),
    case("linearize-weights-pickle-calls-os-system", ["linearize", CNN, "--weights", "{f}/evil_system.pt",
                                                   *good("linearize")[2:]], "would call posix.system"),
    case("compare-output-index-on-a-tensor-output", good("compare", "--output-index", "5"),
         "--output-index 5 selects inside a tuple or dict output, but this layer outputs a plain Tensor"),
    # --- typer's own usage errors: one line too, naming the option and where the options are listed
    case("compare-unknown-option", good("compare", "--nope"), "No such option: --nope"),
    case("compare-n-not-a-number", good("compare", "--n", "abc"), "Invalid value for '--n' / '--num-samples'"),
    case("compare-mode-bad-choice", good("compare", "--mode", "fast"), "'fast' is not one of 'exact', 'minibatch'"),
    case("linearize-epochs-not-a-number", good("linearize", "--epochs", "one"), "'--epochs': expected a number"),
    case("convert-missing-out", good("convert"), "Missing option '--out'; see `simkit convert --help`", out=None),
    case("unknown-command", ["comapre", CNN, CNN], "No such command 'comapre'. Did you mean 'compare'", out=None),
    case("stitch-missing-argument", ["stitch", CNN, "--data", "digits"], "Missing argument 'model_b'", out=None),
    # --- layers, napl, report (no --out)
    case("layers-binary-text-file", ["layers", LLAMA, "--data", "text:{f}/binary.txt,tokenizer=bytes"], "binary.txt",
         out=None),
    case("layers-random-bytes-model", ["layers", "file:{f}/random.pt"], "random.pt", out=None),
    case("layers-random-bytes-model-trust", ["layers", "file:{f}/random.pt", "--trust"], "random.pt", out=None),
    case("layers-select-typo", ["layers", CNN, "--select", "blocks.9"], "blocks.9", out=None),
    case("napl-random-bytes-model", ["napl", "file:{f}/random.pt", "--trust"], "random.pt", out=None),
    case("napl-data-typo", ["napl", CNN, "--data", "digts"], "digits", out=None),
    case("report-result-not-an-object", ["report", "{f}/report_list"], "result.json", out=None),
    case("report-empty-csv", ["report", "{f}/report_empty_csv"], ".csv", out=None),
    case("report-wrong-columns", ["report", "{f}/report_wrong_columns"], ".csv", out=None),
    case("report-missing-dir", ["report", "{f}/nowhere"], "no result.json", out=None),
]


class _Calls:
    """Pickles as a call of ``function(argument)``: what a malicious torch file does on load."""

    def __init__(self, function, argument):
        self.function, self.argument = function, argument

    def __reduce__(self):
        return self.function, (self.argument,)


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """{relative path: (sha256, mtime)} of every file under ``folder``."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def f3_stub(task, s, out, timeout=1800.0):
    return pd.DataFrame({"step": [1], "loss_uninterrupted": [0.0], "loss_killed_resumed": [0.0]}), {
        "f3_resume_bit_identical": True, "f3_without_moments_diverges_at_step": None}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The prepared bad (and good) files every case may name as ``{f}/...``."""
    f = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(0)
    (f / "random.pt").write_bytes(rng.bytes(3000))
    (f / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (f / "afile").write_text("not a directory")
    torch.save(torch.nn.Linear(3, 3).state_dict(), f / "linear.pt")
    data = (f / "linear.pt").read_bytes()
    (f / "trunc.pt").write_bytes(data[: len(data) // 2])
    torch.save(torch.nn.Linear(3, 3), f / "pickled.pt")
    torch.save({"weights": _Calls(os.system, "echo simkit-would-run-this")}, f / "evil_system.pt")
    torch.save(_Calls(eval, "1 + 1"), f / "evil_eval.pt")
    data = (f / "pickled.pt").read_bytes()
    (f / "pickled_trunc.pt").write_bytes(data[: len(data) // 2])
    with zipfile.ZipFile(f / "foreign.pt", "w") as archive:
        archive.writestr("hello.txt", "not a torch file")
    x = rng.random((150, 1, 8, 8)).astype(np.float32)
    np.save(f / "y.npy", (x[:, 0, :4].sum((1, 2)) > x[:, 0, 4:].sum((1, 2))).astype(np.int64))
    early, late = x.copy(), x.copy()
    early[5, 0, 0, 0] = np.nan
    late[100:120, 0, 3, 3] = np.nan  # a few samples only: most of them land in the held-out split
    np.save(f / "nan.npy", early)
    np.save(f / "nan_late.npy", late)
    (f / "oddmodels.py").write_text(ODD_MODEL)
    # caches and run directories for compare and report
    assert invoke("capture", CNN, "--data", "digits", "--n", "64", "--out", f / "cache").exit_code == 0
    shutil.copytree(f / "cache", f / "cache_bad_manifest")
    (f / "cache_bad_manifest" / "manifest.json").write_text('{"format": ')
    shutil.copytree(f / "cache", f / "cache_no_shard")
    for shard in (f / "cache_no_shard").glob("shard-*"):
        shard.unlink()
    assert invoke(*GOOD["compare"], "--out", f / "report_good").exit_code == 0
    for name in ("report_list", "report_empty_csv", "report_wrong_columns"):
        shutil.copytree(f / "report_good", f / name)
    (f / "report_list" / "result.json").write_text("[1, 2]")
    (f / "report_empty_csv" / "similarity.csv").write_text("")
    (f / "report_wrong_columns" / "similarity.csv").write_text("a,b\n1,2\n")
    return f


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """command → a finished run directory of that command (made lazily, once per module)."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            out = tmp_path_factory.mktemp(f"earlier-{name}") / "run"
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("simkit.grafting.experiments.run_f3", f3_stub)
                result = invoke(*GOOD[name], "--out", out)
            assert result.exit_code == 0, result.output
            made[name] = out
        return made[name]

    return get


def out_for(c: Case, files: Path, earlier, tmp_path: Path) -> Path | None:
    if c.out is None:
        return None
    if c.out.startswith("earlier"):
        out = tmp_path / "run"
        shutil.copytree(earlier(c.args[0]), out, copy_function=shutil.copy2)
        if c.out.endswith("-checkpoint"):  # the last checkpoint damaged: truncated or random bytes
            damaged = sorted((out / "checkpoints").glob("*.pt"))[-1]
            damaged.write_bytes(damaged.read_bytes()[:1000] if c.out.endswith("truncated-checkpoint")
                                else np.random.default_rng(1).bytes(1000))
        return out
    if c.out == "new":
        return tmp_path / "new" / "run"
    if c.out.startswith("new/"):
        return tmp_path / "new" / c.out[4:]
    return Path(c.out.format(f=files))


def is_dir(path: Path) -> bool:
    """``path.is_dir()``, False for a name the file system refuses to look up (too long)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output and "internal error" not in output, output
    return lines[0]


@pytest.mark.parametrize("c", CASES)
def test_bad_input_is_refused_with_one_line(c: Case, files, earlier, tmp_path, monkeypatch):
    monkeypatch.setattr("simkit.grafting.experiments.run_f3", f3_stub)
    monkeypatch.chdir(files)
    out = out_for(c, files, earlier, tmp_path)
    before = snapshot(out) if out is not None and is_dir(out) else None
    files_before = snapshot(files)
    args = [a.format(f=files) for a in c.args] + (["--out", str(out)] if out is not None else [])
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    line = one_line(result.output)
    assert line.startswith("error: ") and c.says.format(f=files) in line, line
    if before is not None:
        assert snapshot(out) == before, "the earlier run in --out was changed"
    if c.out is not None and c.out.startswith("new"):
        assert not (tmp_path / "new").exists(), "a run that fails its checks creates nothing"
    changed = {k for k, v in snapshot(files).items() if files_before.get(k) != v} - {"report_list/report.html"}
    assert not {k for k in changed if not k.startswith("__pycache__")}, changed


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 60
    assert {c.values[0].args[0] for c in CASES} >= {"convert", "stitch", "linearize", "graft", "capture",
                                                     "compare", "layers", "napl", "report"}


# ------------------------------------------------------------------------ odd module names


@pytest.mark.parametrize("command", ["stitch", "linearize", "graft", "compare"])
def test_module_names_fx_cannot_print_are_traced(command, files, tmp_path, monkeypatch):
    """Names with a double quote, a space or a dash: fx's generated code gets sanitised names, mapped back."""
    monkeypatch.setattr("simkit.grafting.experiments.run_f3", f3_stub)
    monkeypatch.chdir(files)
    odd = "python:oddmodels:build"
    args = {
        "stitch": ["stitch", odd, odd, "--data", "digits", "--n", "120", "--steps", "3", "--batch-size", "32",
                   "--layer-a", 'act 1', "--layer-b", 'act 1'],
        "linearize": ["linearize", odd, "--data", "digits", "--n", "120", "--epochs", "1", "--omega", "1e-2",
                      "--granularity", "layer", "--batch-size", "64", "--no-cka"],
        "graft": ["graft", odd, "--data", "digits", "--n", "16", "--steps", "3", "--batch-size", "8",
                  "--after", 'conv"2', "--branch", "conv", "--steps", "6"],
        "compare": ["compare", odd, odd, "--data", "digits", "--n", "32", "--layers-a", 'conv"1,act 1',
                    "--layers-b", 'conv"2'],
    }[command]
    result = invoke(*args, "--no-report", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    import simkit

    loaded = simkit.load(tmp_path / "run")
    assert loaded.summary
    names = {  # the tables name the modules as the model does
        "stitch": lambda r: set(r.tables["stitching"]["layer_a"]) == {"act 1"},
        "linearize": lambda r: set(r.tables["layers"]["layer"]) == {"act 1", "act-2"},
        "graft": lambda r: set(r.tables["e1"]["after"]) == {'conv"2'} and 'conv"1' in set(r.tables["e3"]["site"]),
        "compare": lambda r: set(r.tables["similarity"]["layer_a"]) == {'conv"1', "act 1"},
    }[command]
    assert names(loaded), loaded.tables


# ------------------------------------------------------------------------ real subprocesses

SUBPROCESS = ["convert-batch-size-negative", "convert-guide-random-bytes-trust", "stitch-nan-held-out",
              "linearize-out-name-too-long", "graft-n-zero", "capture-out-under-a-file",
              "compare-binary-text-file", "report-empty-csv", "layers-random-bytes-model-trust",
              "compare-out-name-too-long-existing-parent", "layers-model-pickle-calls-eval", "compare-unknown-option",
              "unknown-command", "convert-missing-out"]


@pytest.mark.parametrize("c", [p for p in CASES if p.values[0].id in SUBPROCESS])
def test_bad_input_in_a_real_process_prints_one_line(c: Case, files, earlier, tmp_path):
    out = out_for(c, files, earlier, tmp_path)
    before = snapshot(out) if out is not None and is_dir(out) else None
    args = [a.format(f=files) for a in c.args] + (["--out", str(out)] if out is not None else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "simkit.cli.main", *args], cwd=files, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.strip() == ""
    line = one_line(proc.stderr)
    assert line.startswith("error: ") and c.says in line, line
    if before is not None:
        assert snapshot(out) == before


def test_a_start_that_fails_to_write_leaves_the_earlier_run_as_it_was(earlier, tmp_path, monkeypatch):
    """The earlier run's checkpoints go only once the new inputs.json is written."""
    import errno

    import simkit.io

    out = tmp_path / "run"
    shutil.copytree(earlier("stitch"), out, copy_function=shutil.copy2)
    before = snapshot(out)

    def full_disk(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(simkit.io, "write_json", full_disk)
    result = invoke(*good("stitch", "--seed", "5"), "--out", out)
    assert result.exit_code == 2, result.output
    assert "No space left on device" in one_line(result.output)
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted({Path(k).parts[0] for k in before})


def test_a_capture_that_fails_mid_way_keeps_the_earlier_cache_readable(files, tmp_path):
    """capture touches an earlier cache only once its first batch went through."""
    out = tmp_path / "cache"
    shutil.copytree(files / "cache", out, copy_function=shutil.copy2)
    before = snapshot(out)
    result = invoke("capture", CNN, "--data", "digits", "--n", "64", "--layers", "blocks.0",
                    "--reduce", "cls", "--out", out)  # a reduction that the first batch refuses
    assert result.exit_code == 2, result.output
    one_line(result.output)
    assert snapshot(out) == before
