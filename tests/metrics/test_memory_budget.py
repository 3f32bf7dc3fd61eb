"""The memory budget of the measures (``simkit.settings.memory``): ``auto`` follows the memory available,
``--memory-budget`` parses sizes and reaches the engine, and a refusal names the flag with its ways out."""

from __future__ import annotations

import json

import pytest

import simkit.settings.memory as memory
from simkit.errors import SimkitError
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from tests.helpers import invoke

MLP_A = "simkit:mlp:in_features=40,hidden=16,depth=3"
MLP_B = "simkit:mlp:in_features=40,hidden=12,depth=2"


def fake_meminfo(tmp_path, monkeypatch, text: str) -> None:
    path = tmp_path / "meminfo"
    path.write_text(text, encoding="ascii")
    monkeypatch.setattr(memory, "MEMINFO", path)


def test_auto_is_a_share_of_the_available_memory(tmp_path, monkeypatch):
    fake_meminfo(tmp_path, monkeypatch, "MemTotal:  64000000 kB\nMemFree:  1000 kB\nMemAvailable:  3000000 kB\n")
    assert memory.available_memory_bytes() == 3000000 * 1024
    assert memory.memory_budget("auto") == int(memory.AUTO_FRACTION * 3000000 * 1024)
    assert memory.budget_source("auto").startswith("auto: 50%")
    fake_meminfo(tmp_path, monkeypatch, "MemAvailable:  8 kB\n")   # a tiny machine: streamed sums do not fit
    acc = make_accumulator(CompareSettings(metrics=["cca"], mode="exact", null=0), [30], [20])
    assert acc.describe()["cca"]["path"] == "stored-cov"
    assert f"memory_budget_bytes={int(memory.AUTO_FRACTION * 8 * 1024)}" in acc.describe()["cca"]["reason"]


def test_auto_falls_back_to_a_fixed_budget_when_the_memory_cannot_be_read(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "missing")
    assert memory.available_memory_bytes() is None
    assert memory.memory_budget("auto") == memory.FALLBACK_BUDGET
    assert "could not be read" in memory.budget_source("auto")
    fake_meminfo(tmp_path, monkeypatch, "MemTotal:  64000000 kB\n")   # an old kernel without MemAvailable
    assert memory.memory_budget("auto") == memory.FALLBACK_BUDGET


@pytest.mark.parametrize("given, size", [("4G", 4 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", 3 * 2**29),
                                         ("2k", 2048), ("1048576", 2**20), (12345, 12345), ("AUTO", "auto")])
def test_sizes_are_read_in_binary_units(given, size):
    assert CompareSettings(memory_budget_bytes=given).validate().memory_budget_bytes == size
    if size != "auto":
        assert memory.memory_budget(size) == size


@pytest.mark.parametrize("bad", ["lots", "4X", "-1G", 0, "0", 1.5, True])
def test_a_bad_size_is_refused_naming_the_setting(bad):
    with pytest.raises(SimkitError, match=r"`memory_budget_bytes` must be 'auto' or a size in bytes.*e\.g\. 4G"):
        CompareSettings(memory_budget_bytes=bad).validate()


def test_the_default_is_recorded_as_auto_so_a_resume_on_a_busier_machine_is_the_same_run():
    assert CompareSettings().validate().to_dict()["memory_budget_bytes"] == "auto"


def test_the_flag_reaches_the_engine(tmp_path):
    out = tmp_path / "run"
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "32", "--mode", "exact", "--metric",
                    "linear_cka", "--null", "0", "--memory-budget", "1K", "--no-report", "--out", out)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "result.json").read_text())["meta"]
    assert meta["settings"]["memory_budget_bytes"] == 1024
    assert meta["method"]["linear_cka"]["path"] == "stored-gram"
    assert "memory_budget_bytes=1024" in meta["method"]["linear_cka"]["reason"]


def test_a_refusal_names_the_flag_the_estimate_and_the_ways_out(tmp_path):
    result = invoke("compare", MLP_A, MLP_B, "--data", "mnist1d", "--n", "64", "--metric", "rsa",
                    "--memory-budget", "2K", "--out", tmp_path / "run")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "Traceback" not in text and "memory_budget_bytes" not in text
    assert "> --memory-budget=2.0 KiB (2048 bytes)" in text
    for way in ("use at most n=", "--n", "fewer layers (--layers-a, --layers-b)", "--mode=minibatch",
                "linear_cka, unbiased_cka", "raise --memory-budget to at least 1G"):
        assert way in text, way
    assert not (tmp_path / "run" / "result.json").exists()


def test_the_refusal_suggests_a_budget_that_holds_the_estimate():
    from simkit.metrics.budget import over_budget

    text = str(over_budget("rsa keeps one RDM per layer", need=31 * 2**30 + 1, budget=11 * 2**30))
    assert "raise `memory_budget_bytes` to at least 32G" in text
