"""Network of Theseus conversion (spec §1): plans, recipes, schedules, stage control, resume, baselines."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from simkit.conversion import ConvertSettings, convert, load_plan_file
from simkit.conversion.modules import LowRankLinear, Passthrough, RecurrentBlock
from simkit.conversion.plans import Replacement, ReplacementPlan, build_target, resolve_plan
from simkit.conversion.recipes import attention_to_rnn, conv_to_mlp, deep_to_shallow
from simkit.conversion.runner import recalibrate
from simkit.conversion.schedules import guide_cache, plan_stages, run_stage
from simkit.data import Dataset
from simkit.errors import SimkitError
from simkit.models.llama import TinyLlama
from simkit.models.small import CNN1d

LENGTH = 16


def _signals(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    t = torch.arange(LENGTH, dtype=torch.float32)
    x = 0.5 * torch.randn(n, 1, LENGTH, generator=g) + torch.sin(t * 0.4 * (y[:, None] + 1)).unsqueeze(1)
    return x, y


def tiny_data(n: int = 192, n_test: int = 96) -> Dataset:
    x, y = _signals(n, 0)
    xt, yt = _signals(n_test, 1)
    test = Dataset(xt, yt, "tiny", info={"num_classes": 3})
    return Dataset(x, y, "tiny", test=test, info={"num_classes": 3})


def tiny_guide(layers: int = 2, seed: int = 0) -> CNN1d:
    torch.manual_seed(seed)
    return CNN1d(in_channels=1, length=LENGTH, channels=4, layers=layers, kernel=3, num_classes=3).eval()


QUICK = dict(baselines=[], finetune_epochs=1, head_epochs=1, batch_size=64, finetune_batch_size=64,
             eval_samples=64, compare_layers=False, rank=16)
RUNTIME = ("run_dir", "resume", "device", "progress", "checkpoint_every", "guide_name", "data_name")


def run(guide, data, plan_object=None, **options):
    """``convert`` with ``options`` split into settings fields and runtime arguments (no progress bars);
    ``plan_object``: the ReplacementPlan (``plan`` is the settings' text of a plan file)."""
    runtime = {k: options.pop(k) for k in RUNTIME if k in options}
    return convert(guide, data, ConvertSettings(**options), plan=plan_object, **{"progress": False, **runtime})


def _sample_run(model, data):
    sample = data.inputs[:4]
    return lambda m: m(sample)


# ------------------------------------------------------------------------------------- target modules

def test_low_rank_linear_shapes_and_rank():
    m = LowRankLinear((4, 16), (8, 16), rank=5)
    x = torch.randn(3, 4, 16)
    assert m(x).shape == (3, 8, 16)
    assert m.down.weight.shape == (5, 64) and m.up.weight.shape == (128, 5)
    composite = m.up.weight.detach().double().numpy() @ m.down.weight.detach().double().numpy()
    assert np.linalg.matrix_rank(composite) == 5
    with pytest.raises(SimkitError, match="`rank` must be at least 1"):
        LowRankLinear((4,), (4,), rank=0)


def test_recurrent_block_is_causal_and_residual():
    torch.manual_seed(0)
    block = RecurrentBlock(8, cell="gru")
    x = torch.randn(2, 6, 8)
    y = block(x)
    x2 = x.clone()
    x2[:, 4:] += 1.0  # change the future only
    y2 = block(x2)
    assert torch.equal(y[:, :4], y2[:, :4]) and not torch.allclose(y[:, 4:], y2[:, 4:])
    with torch.no_grad():
        block.proj.weight.zero_()
        block.proj.bias.zero_()
    assert torch.equal(block(x), x)  # the residual path alone
    with pytest.raises(SimkitError, match="unknown recurrent cell"):
        RecurrentBlock(8, cell="transformer")


# ---------------------------------------------------------------------------------------- plans

def test_plan_resolves_shapes_in_forward_order():
    guide, data = tiny_guide(3), tiny_data()
    slots, head = resolve_plan(conv_to_mlp(guide, 8), guide, _sample_run(guide, data))
    assert [s.site for s in slots] == ["blocks.0.conv", "blocks.1.conv", "blocks.2.conv"]
    assert slots[0].in_shape == (1, LENGTH) and slots[0].out_shape == (4, LENGTH)
    assert slots[1].in_shape == (4, LENGTH)
    assert head == "head"
    assert all(isinstance(s.module, LowRankLinear) for s in slots)
    target = build_target(guide, slots)
    assert isinstance(target.get_submodule("blocks.1.conv"), LowRankLinear)
    assert isinstance(guide.get_submodule("blocks.1.conv"), nn.Conv1d)  # the guide is untouched
    assert target(data.inputs[:5]).shape == (5, 3)


def test_plan_naming_a_missing_module_is_an_error():
    guide, data = tiny_guide(), tiny_data()
    plan = ReplacementPlan([Replacement("blocks.7.conv", lambda s: nn.Identity())])
    with pytest.raises(SimkitError, match=r"unknown guide module 'blocks\.7\.conv'.*simkit layers"):
        resolve_plan(plan, guide, _sample_run(guide, data))


def test_plan_shape_mismatch_names_both_shapes():
    guide, data = tiny_guide(), tiny_data()
    plan = ReplacementPlan([Replacement("blocks.0.conv", lambda s: LowRankLinear(s.in_shape, (3, LENGTH), 4))])
    with pytest.raises(SimkitError, match=r"blocks\.0\.conv.*outputs \(3, 16\) but the guide outputs \(4, 16\)"):
        resolve_plan(plan, guide, _sample_run(guide, data))
    # a factory built for the wrong input fails on the guide's input, and says which shape it got
    plan = ReplacementPlan([Replacement("blocks.1.conv", lambda s: LowRankLinear((1, LENGTH), s.out_shape, 4))])
    with pytest.raises(SimkitError, match=r"fails on the guide's input of shape \(4, 16\)"):
        resolve_plan(plan, guide, _sample_run(guide, data))


def test_plan_groups_must_be_chains_and_head_must_stay():
    guide, data = tiny_guide(3), tiny_data()
    plan = ReplacementPlan([Replacement(("blocks.0", "blocks.2"), lambda s: nn.Identity())])
    with pytest.raises(SimkitError, match="is not a chain"):
        resolve_plan(plan, guide, _sample_run(guide, data))
    plan = ReplacementPlan([Replacement("head", lambda s: nn.Linear(4 * LENGTH, 3))])
    with pytest.raises(SimkitError, match="the head 'head' is replaced"):
        resolve_plan(plan, guide, _sample_run(guide, data))
    plan = ReplacementPlan([Replacement("blocks.0", lambda s: nn.Identity()),
                            Replacement("blocks.0.conv", lambda s: nn.Identity())])
    with pytest.raises(SimkitError, match="its submodule"):
        resolve_plan(plan, guide, _sample_run(guide, data))


def test_deep_to_shallow_groups_blocks():
    guide, data = tiny_guide(3), tiny_data()
    plan = deep_to_shallow(guide, group=2)
    slots, _ = resolve_plan(plan, guide, _sample_run(guide, data))
    assert [s.names for s in slots] == [("blocks.0", "blocks.1")]
    assert slots[0].in_shape == (1, LENGTH) and slots[0].out_shape == (4, LENGTH)
    target = build_target(guide, slots)
    assert isinstance(target.get_submodule("blocks.1"), Passthrough)
    # the new block is freshly initialised, not the guide's weights
    assert not torch.equal(target.blocks[0].conv.weight, guide.blocks[0].conv.weight)
    with pytest.raises(SimkitError, match="`group`"):
        deep_to_shallow(guide, group=4)


def test_plan_from_file(tmp_path):
    path = tmp_path / "my_plan.py"
    path.write_text(
        "from simkit.conversion.modules import LowRankLinear\n"
        "def make_plan(guide):\n"
        "    return {'blocks.1.conv': lambda slot: LowRankLinear(slot.in_shape, slot.out_shape, 8)}\n")
    guide = tiny_guide()
    text = f"{path}:make_plan"
    result = run(guide, tiny_data(), load_plan_file(text, guide), recipe=None, plan=text, steps_per_stage=2,
                 **QUICK)
    assert [s["names"] for s in result.extra["slots"]] == [["blocks.1.conv"]]
    assert result.summary["recipe"].startswith("plan:")
    assert result.meta["settings"]["plan"] == text
    with pytest.raises(SimkitError, match="has no function 'nope'"):
        load_plan_file(f"{path}:nope", guide)
    with pytest.raises(SimkitError, match="pass the plan itself"):  # the text alone runs no code
        convert(guide, tiny_data(), ConvertSettings(**QUICK, plan=text), progress=False)


# ---------------------------------------------------------------------------------- conversion

def _stage_cka(result, stage: str, layer: str) -> float:
    st = result.tables["stages"]
    return float(st[(st["stage"] == stage) & (st["layer"] == layer)]["value"].iloc[0])


def test_one_stage_conversion_reaches_high_cka():
    guide, data = tiny_guide(1), tiny_data()
    # no stop rule: stopping at a training loss of 0.01 leaves the held-out CKA at 0.976-0.983
    # depending on the seed, a coin flip against the threshold; 150 full steps reach 0.991-0.995
    common = dict(QUICK, plateau_window=0, lr=3e-3, stop_loss=None)
    short = run(guide, data, steps_per_stage=1, **common)
    long = run(guide, data, steps_per_stage=150, **common)
    before, after = _stage_cka(short, "stage1", "blocks.0.conv"), _stage_cka(long, "stage1", "blocks.0.conv")
    assert after > 0.98, after
    assert after > before + 0.02, (before, after)


@pytest.mark.parametrize("metric", ["linear_cka", "unbiased_cka", "dmnn"])
def test_conversion_works_with_each_alignment_loss(metric):
    guide, data = tiny_guide(1), tiny_data()
    common = dict(QUICK, plateau_window=0, lr=3e-3, metric=[metric], stop_loss=None)
    short = run(guide, data, steps_per_stage=1, **common)
    long = run(guide, data, steps_per_stage=60, **common)
    curve = long.tables["curves"]
    losses = curve[curve["phase"] == "stage1"]["loss"].to_numpy()
    assert losses[-1] < 0.7 * losses[0], (losses[0], losses[-1])
    assert _stage_cka(long, "stage1", "blocks.0.conv") > _stage_cka(short, "stage1", "blocks.0.conv")
    assert long.tables["runs"]["metric"].tolist() == [metric]


def _module_params(prefixes):
    return {f"{p}.{w}" for p in prefixes for w in ("down.weight", "up.weight", "up.bias")}


@pytest.mark.parametrize("schedule", ["progressive", "sequential", "independent", "joint"])
def test_schedules_train_exactly_their_modules(schedule):
    guide, data = tiny_guide(3), tiny_data()
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    result = run(guide, data, schedule=[schedule], steps_per_stage=2, stop_loss=None, **QUICK)
    sites = ["blocks.0.conv", "blocks.1.conv", "blocks.2.conv"]
    expected = {
        "progressive": [sites[:1], sites[:2], sites[:3]],
        "sequential": [[sites[0]], [sites[1]], [sites[2]]],
        "independent": [[sites[0]], [sites[1]], [sites[2]]],
        "joint": [sites],
    }[schedule]
    summary = result.tables["stage_summary"]
    assert len(summary) == len(expected)
    for (_, row), modules in zip(summary.iterrows(), expected, strict=True):
        assert set(row["trainable"].split(";")) == _module_params(modules), row["stage"]
        assert set(row["changed"].split(";")) == _module_params(modules), row["stage"]
    assert summary["steps"].tolist() == ([6] if schedule == "joint" else [2, 2, 2])
    for key, value in guide.state_dict().items():  # the guide is frozen
        assert torch.equal(value, before[key]), key


def test_progressive_forward_stops_at_the_newest_module():
    guide, data = tiny_guide(3), tiny_data()
    slots, _ = resolve_plan(conv_to_mlp(guide, 8), guide, _sample_run(guide, data))
    cache = guide_cache(guide, slots, data.inputs, 64)
    hybrid = __import__("copy").deepcopy(guide)
    calls = {"blocks.1": 0, "blocks.2": 0, "head": 0, "blocks.0.relu": 0}
    for name in calls:
        hybrid.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: calls.__setitem__(name, calls[name] + 1))
    modules = [__import__("copy").deepcopy(s.module) for s in slots]
    stage = plan_stages("progressive", 3, 3)[0]
    from simkit.metrics.losses import cka_loss

    def fit_stage(model, loss_fn, data_, params):
        for _ in range(3):
            loss_fn((torch.arange(64),)).backward()
        return None

    run_stage(hybrid, slots, modules, stage, cache, data.inputs, cka_loss, fit_stage)
    assert calls == {"blocks.1": 0, "blocks.2": 0, "head": 0, "blocks.0.relu": 0}
    assert hybrid.get_submodule("blocks.0.conv") is modules[0]
    assert all(not p.requires_grad for p in hybrid.parameters())  # frozen again after the stage


def test_guide_runs_once_per_batch_not_per_stage():
    data = tiny_data()

    def count_guide_calls(**kwargs) -> tuple[int, object]:
        guide = tiny_guide(3)
        calls = []
        original = type(guide).forward

        def forward(self, x):
            if self is guide:
                calls.append(len(x))
            return original(self, x)

        guide.forward = forward.__get__(guide)
        result = run(guide, data, **{**QUICK, **kwargs})
        return len(calls), result

    few, r1 = count_guide_calls(steps_per_stage=1, schedule=["progressive"])
    many, r2 = count_guide_calls(steps_per_stage=5, schedule=["progressive", "sequential", "joint"])
    assert few == many
    assert r1.extra["guide_forward_batches"] == math.ceil(192 / 64)


def test_batchnorm_recalibration_changes_only_running_stats():
    guide, data = tiny_guide(2), tiny_data()
    slots, _ = resolve_plan(conv_to_mlp(guide, 8), guide, _sample_run(guide, data))
    target = build_target(guide, slots)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    recalibrate(target, data.inputs, batch_size=len(data))
    after = target.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.split(".")[-1] in ("running_mean", "running_var", "num_batches_tracked")
                           for k in changed)
    assert {"blocks.0.bn.running_mean", "blocks.0.bn.running_var"} <= changed
    # float64 reference for the first BN: its input is the first target module's output on all data
    with torch.no_grad():
        z = target.blocks[0].conv(data.inputs).double().numpy()  # (n, C, L)
    flat = z.transpose(1, 0, 2).reshape(z.shape[1], -1)
    np.testing.assert_allclose(after["blocks.0.bn.running_mean"].numpy(), flat.mean(1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(after["blocks.0.bn.running_var"].numpy(), flat.var(1, ddof=1), rtol=1e-4, atol=1e-5)


def test_resume_after_interruption_mid_stage(tmp_path, monkeypatch):
    import simkit.metrics.losses as losses

    data = tiny_data()
    common = dict(QUICK, steps_per_stage=6, checkpoint_every=2, stop_loss=None)
    reference = run(tiny_guide(3), data, run_dir=tmp_path / "ref", **common)

    real = losses.LOSSES["cka"]
    calls = {"n": 0}

    def interrupting(target, guide):
        calls["n"] += 1
        # stage 1: 6 calls, then 3 for the held-out loss of each layer; stage 2: 2 per step; fail in step 4
        if calls["n"] == 6 + 3 + 2 * 3 + 1:
            raise KeyboardInterrupt
        return real(target, guide)

    monkeypatch.setitem(losses.LOSSES, "cka", interrupting)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_guide(3), data, run_dir=tmp_path / "run", **common)
    assert (tmp_path / "run/checkpoints/trained-progressive-linear_cka-stage1.pt").is_file()
    assert (tmp_path / "run/checkpoints/trained-progressive-linear_cka-stage2.pt").is_file()

    calls["n"] = -10**9  # never interrupt again; count what the resumed run computes
    resumed = run(tiny_guide(3), data, run_dir=tmp_path / "run", resume=True, **common)
    redone = calls["n"] + 10**9
    # stage 1 skipped (its held-out rows recomputed); stage 2 from step 2; stage 3 in full; 3 held-out
    # losses after every stage and after fine-tuning
    assert redone == 2 * (6 - 2) + 3 * 6 + 3 * 4
    pd.testing.assert_frame_equal(resumed.tables["stages"], reference.tables["stages"])
    pd.testing.assert_frame_equal(resumed.tables["runs"].drop(columns=["seconds", "align_seconds"]),
                                  reference.tables["runs"].drop(columns=["seconds", "align_seconds"]))


def test_baselines_guide_inits_and_comma_lists_give_one_row_each():
    data = tiny_data()
    result = run(tiny_guide(2), data, **{
        **QUICK, "baselines": ["scratch", "kd"], "schedule": ["progressive", "joint"],
        "metric": ["cka", "dmnn"], "guide_init": ["trained", "random"], "steps_per_stage": 2})
    runs = result.tables["runs"]
    assert len(runs) == 8
    assert set(map(tuple, runs[["schedule", "metric", "guide_init"]].to_numpy())) == {
        (s, m, g) for s in ("progressive", "joint") for m in ("linear_cka", "dmnn") for g in ("trained", "random")}
    for key in ("guide_accuracy", "converted_accuracy", "scratch_accuracy", "kd_accuracy", "schedule",
                "metric", "recipe"):
        assert key in result.summary
    assert result.summary["schedule"] == "progressive" and result.summary["metric"] == "linear_cka"  # cka: its alias
    assert runs["scratch_accuracy"].nunique() == 1  # one scratch baseline shared by all rows
    # the random guide is a different network than the trained one
    guides = runs.groupby("guide_init")["guide_accuracy"].first()
    assert set(guides.index) == {"trained", "random"}
    assert {"stage", "layer", "alignment_metric", "value"} <= set(result.tables["stages"].columns)
    for column in ("probe_accuracy", "converted_accuracy", "scratch_accuracy", "kd_accuracy"):
        assert runs[column].between(0, 1).all()


def test_n_caps_the_data_before_the_split_for_a_spec_and_a_dataset_alike(tmp_path):
    from simkit.data import load_data

    x, y = _signals(50, 0)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    spec = f"npy:{tmp_path / 'x.npy'},labels={tmp_path / 'y.npy'}"
    common = dict(steps_per_stage=1, n=30, **QUICK)
    # no native test split: the first 30 samples, then the seeded 80/20 split of those 30
    for data in (load_data(spec, n=30), load_data(spec)):  # the CLI's load, and a whole Dataset
        meta = run(tiny_guide(), data, **common).meta
        # 24 training rows, of which 10 % (2) are the validation split
        assert (meta["n"], meta["n_train"], meta["n_val"], meta["n_test"]) == (30, 22, 2, 6)
    # a native test split is kept whole; n caps the training part (then 3 of its 30 validate)
    meta = run(tiny_guide(), tiny_data(), **common).meta
    assert (meta["n_train"], meta["n_val"], meta["n_test"]) == (27, 3, 96)


def test_bad_names_are_errors():
    guide, data = tiny_guide(), tiny_data()
    with pytest.raises(SimkitError, match="unknown schedule 'spiral'"):
        run(guide, data, schedule=["spiral"], **QUICK)
    with pytest.raises(SimkitError, match="unknown alignment loss 'mse'"):
        run(guide, data, metric=["mse"], **QUICK)
    with pytest.raises(SimkitError, match=r"`recipe` must be one of conv-to-mlp, .* got 'conv-to-kan'"):
        run(guide, data, recipe="conv-to-kan", **QUICK)
    with pytest.raises(SimkitError, match="unknown guide init 'pretrained'"):
        run(guide, data, guide_init=["pretrained"], **QUICK)
    with pytest.raises(SimkitError, match="`resume` needs `run_dir`"):
        run(guide, data, resume=True, **QUICK)


# ------------------------------------------------------------------------------- language model

def _token_data(n: int, seed: int, vocab: int = 12, t: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    step = torch.randint(1, 3, (n, 1), generator=g)
    return (start + step * torch.arange(t)) % vocab  # predictable sequences


def test_attention_to_rnn_converts_a_causal_lm():
    torch.manual_seed(0)
    guide = TinyLlama(vocab=12, d=16, heads=2, blocks=2, max_len=16).eval()
    test = Dataset(_token_data(32, 1), None, "tokens")
    data = Dataset(_token_data(96, 0), None, "tokens", test=test)
    plan = attention_to_rnn(guide)
    assert [r.guide for r in plan.replacements] == ["blocks.0", "blocks.1"]
    # aligned on the residual branch: the cache holds block(x) − x, not the residual stream
    slots, head = resolve_plan(plan, guide, lambda m: m(data.inputs[:4]))
    assert head == "head" and [s.align for s in slots] == ["delta", "delta"]
    cache = guide_cache(guide, slots, data.inputs[:8], 4)
    with torch.no_grad():
        h0 = guide.embed(data.inputs[:8])
        h1 = guide.blocks[0](h0)
        expected = [h1 - h0, guide.blocks[1](h1) - h1]
    for got, want in zip(cache.outputs, expected, strict=True):
        torch.testing.assert_close(got, want)
    result = run(guide, data, recipe="attention-to-rnn", steps_per_stage=3, train_guide=1,
                            **{**QUICK, "baselines": ["scratch", "kd"], "batch_size": 32})
    for key in ("guide_perplexity", "converted_perplexity", "scratch_perplexity", "kd_perplexity"):
        assert key in result.summary and result.summary[key] >= 1.0
    assert [s["target"] for s in result.extra["slots"]] == ["RecurrentBlock", "RecurrentBlock"]
    assert result.summary["task"] == "lm"


def test_deep_to_shallow_conversion_runs_end_to_end():
    guide = tiny_guide(3)
    result = run(guide, tiny_data(), recipe="deep-to-shallow", schedule=["progressive", "independent"],
                            steps_per_stage=3, **QUICK)
    stages = result.tables["stages"]
    assert set(stages["layer"]) == {"blocks.0..blocks.1"}
    assert set(stages[stages["schedule"] == "independent"]["stage"]) == {"stage1", "assembled", "finetuned"}
    assert result.extra["slots"][0]["guide_params"] > result.extra["slots"][0]["target_params"]
    assert result.tables["runs"]["converted_accuracy"].between(0, 1).all()


# ------------------------------------------------------------------------------- run directory

def test_resume_from_python_refuses_changed_inputs_and_bad_runs_leave_the_directory(tmp_path):
    import hashlib
    import json

    def snapshot(folder):
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file()}

    data, out = tiny_data(), tmp_path / "run"
    common = dict(QUICK, steps_per_stage=1, schedule=["joint"])
    first = run(tiny_guide(), data, run_dir=out, **common)
    record = json.loads((out / "inputs.json").read_text())
    assert record["command"] == "convert" and record["options"]["steps_per_stage"] == 1
    before = snapshot(out)
    again = run(tiny_guide(), data, run_dir=out, resume=True, **common)  # same inputs: continues
    assert again.tables["runs"]["converted_accuracy"].tolist() == first.tables["runs"]["converted_accuracy"].tolist()
    for change in (dict(common, steps_per_stage=2), dict(common, seed=1)):
        with pytest.raises(SimkitError, match="was made with other inputs"):
            run(tiny_guide(), data, run_dir=out, resume=True, **change)
    with pytest.raises(SimkitError, match="guide: "):  # another guide (other weights) is another input
        run(tiny_guide(seed=1), data, run_dir=out, resume=True, **common)
    assert snapshot(out) == before
    # a fresh run that fails validation leaves the earlier run as it was (checkpoints included)
    for bad in (dict(common, schedule=["spiral"]), dict(common, n=3)):
        with pytest.raises(SimkitError):
            run(tiny_guide(), data, run_dir=out, **bad)
    assert snapshot(out) == before
