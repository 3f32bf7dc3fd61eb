"""What users type, fuzzed through the real command parser in process (issue #25).

Property: every command line either runs (exit 0) or is refused with exactly one line ``error: ...``
and exit code 2; never a traceback, never an internal error (exit 1), never typer's framed box. The
inputs are the things people type: model specs (the zoo with odd parameters, other kinds, junk), data
specs, layer selectors, comma lists, numbers, output paths, and stray options and commands. Work is kept
tiny (8 samples of small zoo models; sizes drawn small), so each example takes a fraction of a second.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from simkit.cli.main import app

pytestmark = pytest.mark.usefixtures("one_thread")

TRIED: list[str] = []  # every command line tried, over the module (the figure for the issue)
COMMON = settings(max_examples=int(os.environ.get("SIMKIT_FUZZ_EXAMPLES", "60")), deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

junk = st.text(alphabet=string.printable.replace("\x0b", "").replace("\x0c", "") + "é→ ✓", max_size=40)
small_int = st.integers(min_value=-3, max_value=12)
number_text = st.one_of(small_int.map(str), st.sampled_from(["0", "-1", "1e3", "nan", "inf", "-inf", "1.5", "", " ",
                                                              "0x10", "1_0", "٣", "abc", "1e309", "8 "]), junk)
# zoo models with odd parameters: sizes drawn small so that a run that is accepted stays tiny
ZOO_KEYS = {"mlp": ["in_features", "hidden", "depth", "num_classes"],
            "cnn1d": ["in_channels", "length", "channels", "layers", "kernel", "batchnorm", "residual", "num_classes"],
            "cnn2d": ["channels", "layers", "batchnorm", "num_classes"],
            "vit": ["dim", "depth", "heads", "patch", "mlp_ratio", "length", "size", "pool"],
            "llama": ["vocab", "d", "heads", "blocks", "max_len"]}
value = st.one_of(small_int.map(str), st.sampled_from(["true", "false", "cls", "mean", "0.5", "", "x", "1e9", "-0"]))
zoo_spec = st.builds(
    lambda name, pairs: f"simkit:{name}" + (":" + ",".join(f"{k}={v}" for k, v in pairs) if pairs else ""),
    st.sampled_from([*ZOO_KEYS, "nope", "MLP", ""]),
    st.lists(st.tuples(st.sampled_from(sorted({k for keys in ZOO_KEYS.values() for k in keys} | {"bogus", ""})),
                       value), max_size=3))
model_spec = st.one_of(
    zoo_spec,
    st.sampled_from(["simkit:mlp", "simkit:cnn1d:channels=4,layers=2", "simkit:mlp:in_features=40,hidden=8,depth=2",
                     "torchvision:resnet_nope", "timm:nope", "hf:/nonexistent", "file:/nonexistent.pt", "file:",
                     "python:", "python:os:system", "python:nope.mod:fn", "simkit:", ":", "simkit::", "file:.",
                     "python:simkit.models.small:nope"]),
    junk)
data_spec = st.one_of(
    st.sampled_from(["mnist1d", "digits", "synthetic:1x40", "synthetic:40", "synthetic:", "synthetic:0x40",
                     "synthetic:3x8x8", "synthetic:-1", "synthetic:axb", "npy:/nonexistent.npy", "pt:", "text:",
                     "imagefolder:/nonexistent", "mnist", "cifar10", "digits,", "mnist1d:x", ""]),
    st.builds(lambda dims: "synthetic:" + "x".join(map(str, dims)), st.lists(st.integers(0, 40), min_size=1,
                                                                              max_size=3)),
    junk)
selector = st.one_of(st.sampled_from(["blocks", "*", "blocks.*", "type:Linear", "type:Nope", "type:", "", ",", "0",
                                      "net.0,net.2", "[", "**", "blocks.99", " blocks "]),
                     st.lists(st.text(alphabet="abcxyz.*?[]:_0129 ", max_size=12), max_size=3).map(",".join))
metric_list = st.lists(st.sampled_from(["linear_cka", "unbiased_cka", "cka", "", " ", "linear_cka ", "LINEAR_CKA",
                                        "rbf_cka", "nope"]), max_size=3).map(",".join)
path_name = st.text(alphabet=string.ascii_letters + string.digits + " ._-~é→$*?'\"" + "/", min_size=1, max_size=300)


def under(folder: Path, name: str) -> str:
    """``name`` typed as a path below ``folder`` (never above it: no absolute path, no ``..``)."""
    return str(folder) + "/" + "/".join("dd" if part == ".." else part for part in name.split("/"))


def run(args: list[str]) -> None:
    TRIED.append(" ".join(args))
    result = CliRunner().invoke(app, args)
    output = result.output
    assert result.exit_code in (0, 2), f"{args!r} → exit {result.exit_code}:\n{output}\n{result.exception!r}"
    assert "Traceback" not in output and "internal error" not in output and "╭" not in output, (args, output)
    if result.exit_code == 2:
        lines = output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, output)


@pytest.fixture
def here(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    before = os.getcwd()
    os.chdir(folder)  # relative paths that users type land here
    yield folder
    os.chdir(before)


@COMMON
@given(model=model_spec, data=st.one_of(st.none(), data_spec), select=st.one_of(st.none(), selector))
def test_layers_takes_any_spec_and_selector(here, model, data, select):
    args = ["layers", model, *(["--data", data] if data is not None else []),
            *(["--select", select] if select is not None else [])]
    run(args)


@COMMON
@given(model_a=model_spec, layers=selector, metrics=metric_list, n=number_text, batch=number_text,
       null=st.one_of(st.none(), number_text), mode=st.sampled_from(["minibatch", "exact", "Exact", "", "fast"]),
       name=path_name)
def test_compare_takes_any_spec_list_number_and_path(here, model_a, layers, metrics, n, batch, null, mode, name):
    out = under(here / "runs", name)
    args = ["compare", model_a, "simkit:mlp:in_features=40,hidden=8,depth=2", "--data", "mnist1d", "--n", n,
            "--batch-size", batch, "--layers-a", layers, "--mode", mode, "--out", out, "--no-report"]
    if metrics:
        args += ["--metric", metrics]
    if null is not None:
        args += ["--null", null]
    args += ["--n", "8"] if n.strip().lstrip("-").isdigit() and int(n) > 8 else []  # the last --n wins: stay tiny
    run(args)


@COMMON
@given(data=data_spec, n=number_text, omega=st.lists(number_text, max_size=3).map(",".join), name=path_name)
def test_a_training_command_refuses_or_runs_tiny(here, data, n, omega, name):
    """linearize with fuzzed data, numbers and paths, cut short by --epochs 0.01 (one step)."""
    args = ["linearize", "simkit:mlp:in_features=40,hidden=8,depth=2", "--data", data, "--n", n, "--omega", omega,
            "--epochs", "0.01", "--no-cka", "--no-report", "--out", under(here / "runs", name)]
    args += ["--n", "16"] if n.strip().lstrip("-").isdigit() and int(n) > 16 else []
    run(args)


COMMANDS = ["compare", "capture", "convert", "stitch", "linearize", "graft", "napl", "layers", "report"]
OPTIONS = ["--n", "--out", "--data", "--seed", "--batch-size", "--mode", "--metric", "--resume", "--trust", "--nope",
           "-x", "--", "--help=no", "--n=", "--layers-a", "--epochs", "--omega", "--granularity", "--device"]


@COMMON
@given(st.lists(st.one_of(st.sampled_from(COMMANDS + ["", "comapre", "help", "-h", "--version"]),
                          st.sampled_from(OPTIONS), number_text, junk), min_size=1, max_size=6))
def test_any_token_sequence_is_a_run_or_one_line(here, tokens):
    """Commands and options in any order and number: usage errors are one line too. Tokens that would
    start real work get no model that loads (the first token is a command, the rest fuzz), except when
    the fuzz builds a whole command line by chance, which then runs on the defaults' tiny data."""
    if tokens[0] in ("convert", "stitch", "graft", "capture", "compare", "linearize"):
        tokens = [tokens[0], "simkit:nope", *tokens[1:]]  # never a model that trains for minutes
    if any(t in ("--help", "-h") for t in tokens):
        return
    run(tokens)


def test_fuzz_volume():
    """The figure for the issue: how many command lines the fuzz tried (run after the properties)."""
    print(f"\ncommand lines tried: {len(TRIED)}")
    assert len(TRIED) >= 4 * 20 or os.environ.get("SIMKIT_FUZZ_EXAMPLES")


def test_paths_are_not_touched_by_refused_runs(tmp_path):
    """A spot check of the property's 'refused: nothing created' side for --out under a fresh folder."""
    out = tmp_path / "new" / "run"
    result = CliRunner().invoke(app, ["compare", "simkit:nope", "simkit:mlp", "--data", "mnist1d", "--n", "8",
                                      "--out", str(out)])
    assert result.exit_code == 2 and not Path(tmp_path / "new").exists(), result.output
