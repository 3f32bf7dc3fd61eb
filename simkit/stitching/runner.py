"""``stitch``: standard and invariance-aware stitching over layer pairs and objectives.

For each (layer of A, layer of B) pair and each setting — ``standard`` (the stitch is trained on the
stitching data's training inputs) and, with ``iri=True``, ``iri`` (trained only on IRIs of A at the
stitch layer, with targets from B on the IRIs and the originals' labels for HLM) — and each objective,
a stitch is initialised by least squares on that setting's inputs, trained with the shared loop, and
evaluated on the evaluation set (the data's test split, or ``test_data``): stitched accuracy, B's
accuracy and the penalty ``b_accuracy − stitched_accuracy``. With ``train`` > 0, copies of A and B are
first trained on the stitching data (stages ``train_a``, ``train_b``). A model at chance and IRIs that
missed their tolerance are warned about (``summary["warnings"]``, :mod:`simkit.stitching.checks`).

The run goes in phases, each its own function passing small dataclasses on: check and split
(:func:`simkit.stitching.prepare.prepare` → ``Prepared``), cut the models and open the run directory
(``_setup`` → ``_Setup``), train the models or take them (``_models``), the arms of every pair and
objective (``_arms`` → :class:`~simkit.stitching.assemble.ArmRows`), and the result
(:func:`simkit.stitching.assemble.assemble`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from simkit.data import Dataset
from simkit.forward import ModelSource, build_model, check_accepts, modes_kept
from simkit.progress import overall_progress, phase, seed_position
from simkit.provenance import Timer, weights_words
from simkit.results import StitchResult
from simkit.rundir import RunDir, open_run_dir
from simkit.seeding import derive_seed
from simkit.settings.stitch import IRISettings, StitchSettings
from simkit.stitching.assemble import COLUMNS, ArmRows, RunFacts, assemble
from simkit.stitching.halves import BackHalf, FrontHalf, frozen_copy, record
from simkit.stitching.iri import IRISet, generate_iris, seed_distances, tensor_digest
from simkit.stitching.iri import fingerprint as weights_digest
from simkit.stitching.prepare import (
    Prepared,
    check_arguments,
    checked_settings,
    prepare,
    python_inputs,
    value_range,
)
from simkit.stitching.stitch_layer import StitchLayer, check_bridgeable, infer_layout
from simkit.stitching.stitched import StitchedModel, StitchLoss
from simkit.training import (
    TrainConfig,
    TrainHistory,
    ValidationMonitor,
    evaluate_accuracy,
    fit,
    train_classifier,
)

__all__ = ["COLUMNS", "DEFAULT_CACHE", "ModelSource", "StitchResult", "StitchSettings", "stitch"]

# what ``stitch`` takes as a model: a module, or a factory building the model of each seed

DEFAULT_CACHE = Path("runs/.iri-cache")
COMMAND = "stitch"


def _check_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _batches(x: Tensor, size: int) -> Iterator[Tensor]:
    for start in range(0, len(x), size):
        yield x[start:start + size]


def _lstsq_state(front: FrontHalf, back: BackHalf, stitch: StitchLayer, x: Tensor, batch_size: int,
                 device: torch.device) -> tuple[dict[str, Tensor], float]:
    """Least-squares (DM) init of ``stitch`` from inputs ``x (n, ...)``: (state_dict, DM residual)."""
    def pairs() -> Iterator[tuple[Tensor, Tensor]]:
        for xb in _batches(x, batch_size):
            xb = xb.to(device)
            with torch.no_grad(), record(back.model, [back.layer]) as acts:
                back.model(xb)
                h_a = front(xb)
            yield h_a.cpu(), acts[back.layer].cpu()

    stitch.fit(pairs())
    return {k: v.clone() for k, v in stitch.state_dict().items()}, stitch.dm_residual_


@torch.no_grad()
def _accuracy(model: nn.Module, x: Tensor, y: Tensor | None) -> float:
    """Top-1 accuracy on the evaluation set (in eval mode, every module's own mode kept after it);
    NaN when the data has no labels."""
    if y is None:
        return float("nan")
    with modes_kept(model):
        return evaluate_accuracy(model, x, y, batch_size=512)


def _trained(model: nn.Module, train: Dataset, settings: StitchSettings, run: _SeedRun, label: str,
             run_dir: Path | None, options: _Options, dev: torch.device) -> nn.Module:
    """A copy of ``model`` trained ``settings.train`` epochs with cross-entropy on ``train`` (stage
    ``train_<label>`` plus the seed's suffix, checkpointed and resumed like every stitch; batch order
    from ``derive_seed(seed, "train", label)``), in eval mode."""
    copy = frozen_copy(model).to(dev)
    for param in copy.parameters():
        param.requires_grad_(True)
    config = TrainConfig(epochs=settings.train, batch_size=settings.batch_size, lr=settings.lr, optimizer="adam",
                         seed=derive_seed(run.seed, "train", label), progress=options.progress,
                         description=f"train model {label.upper()}{_seed_text(run)}")
    train_classifier(copy, train, config, run_dir=run_dir, name=f"train_{label}{run.suffix}", resume=options.resume)
    return copy.eval()


@dataclass(frozen=True)
class _Cut:
    """A layer pair cut: A's front half up to ``la``, B's back half from ``lb``, the shapes at the cut
    (without the batch axis) and A's activation layout there."""

    la: str
    lb: str
    front: FrontHalf
    back: BackHalf
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    layout: str


def _cut(model_a: nn.Module, model_b: nn.Module, pairs: Sequence[tuple[str, str]], probe: Tensor, tokens: bool,
         dev: torch.device) -> list[_Cut]:
    """Cut both models at every pair and check that a stitch can bridge the shapes (fail fast)."""
    plan = []
    for la, lb in pairs:
        front, back = FrontHalf(model_a, la).to(dev), BackHalf(model_b, lb).to(dev)
        back.probe(probe)
        with torch.no_grad(), record(back.model, [lb]) as acts:
            back.model(probe)
            h_a = front(probe)
        shape_a, shape_b = tuple(h_a.shape[1:]), tuple(acts[lb].shape[1:])
        layout_a, layout_b = infer_layout(shape_a, tokens=tokens), infer_layout(shape_b, tokens=tokens)
        check_bridgeable(shape_a, shape_b, layout_a, layout_b, where=f"A.{la} → B.{lb}")
        plan.append(_Cut(la, lb, front, back, shape_a, shape_b, layout_a))
    return plan


@dataclass(frozen=True)
class _Setup:
    """The models cut at every pair (checked against a two-sample probe), the IRI clamp range and
    the opened run directory (``checkpoints``: its path, or None)."""

    probe: Tensor
    plan: list[_Cut]
    value_range: tuple[float, float]
    range_source: str
    checkpoints: Path | None


@dataclass(frozen=True)
class _Options:
    """How ``stitch`` was asked to run, beyond the settings: resume, progress bars, the IRI cache."""

    resume: bool
    progress: bool
    cache_dir: str | Path | None


def _setup(model_a: nn.Module, model_b: nn.Module, prep: Prepared, run_dir: RunDir | str | Path | None,
           resume: bool) -> _Setup:
    """Check that both models take the data, cut them at every pair, find the IRI clamp range and open
    (and start) the run directory: the last check, then the first write."""
    probe = prep.x_train[:2].to(prep.dev)
    check_accepts(model_a, probe, "model A")
    check_accepts(model_b, probe, "model B")
    plan = _cut(model_a, model_b, prep.pairs, probe, prep.tokens, prep.dev)
    clamp, source = value_range(prep.train, prep.x_train)
    run = open_run_dir(run_dir, COMMAND, python_inputs(run_dir, prep.settings, model_a, model_b, prep.data,
                                                       prep.test_data), resume=resume)
    if run is not None:
        run.start()  # the first write: everything above was checking
    return _Setup(probe, plan, clamp, source, run.path if run is not None else None)


def _models(model_a: nn.Module, model_b: nn.Module, plan: list[_Cut], prep: Prepared, setup: _Setup,
            options: _Options, run: _SeedRun, timer: Timer) -> tuple[nn.Module, nn.Module, list[_Cut]]:
    """(A, B, cuts) of one seed: the models as given (``plan``: their cuts), or with ``settings.train``
    > 0 copies trained with that seed (stages ``train_a``, ``train_b``, with ``_s<seed>`` appended when
    several seeds run; timed as ``train_models``) cut again at every pair."""
    if prep.settings.train <= 0:
        return model_a, model_b, plan
    with timer("train_models"):
        phase(f"training A{seed_position(run.seed, prep.settings.seed_list())}")
        model_a = _trained(model_a, prep.train, prep.settings, run, "a", setup.checkpoints, options, prep.dev)
        phase(f"training B{seed_position(run.seed, prep.settings.seed_list())}")
        model_b = _trained(model_b, prep.train, prep.settings, run, "b", setup.checkpoints, options, prep.dev)
    return model_a, model_b, _cut(model_a, model_b, prep.pairs, setup.probe, prep.tokens, prep.dev)


@dataclass(frozen=True)
class _SeedRun:
    """One seed of the run: the seed, and the suffix its checkpoint names get (``_s<seed>`` when several
    seeds run, nothing for a single seed, so a one-seed run names its stages as before)."""

    seed: int
    suffix: str


@dataclass(frozen=True)
class _ArmContext:
    """What every arm of one seed needs: the run's inputs and options, where checkpoints go, the seed,
    the accuracies of that seed's A and B, and the IRI settings with the parts of their cache key that
    do not depend on the layer."""

    prep: Prepared
    options: _Options
    checkpoints: Path | None
    run: _SeedRun
    a_acc: float
    b_acc: float
    iri_settings: IRISettings
    value_range: tuple[float, float]
    data_key: str
    fp_a: str


@torch.no_grad()
def _predict(model: nn.Module, x: Tensor, device: torch.device, batch_size: int = 512) -> Tensor:
    """Predicted classes ``(n,)`` of ``model`` on ``x (n, ...)`` (eval mode, modes kept afterwards)."""
    with modes_kept(model):
        model.eval()
        return torch.cat([model(xb.to(device)).argmax(dim=1).cpu() for xb in _batches(x, batch_size)])


def _iri_diagnostics(ctx: _ArmContext, cut: _Cut, iris: IRISet) -> dict[str, float]:
    """How far the IRIs at ``cut.la`` moved from their seeds (L∞, L2 in input units: median and mean),
    and which class B gives them: the fraction labelled as the input they represent (its label; B's own
    prediction on it without labels) and, among IRIs started from another input, as that seed's."""
    x = ctx.prep.x_train
    linf, l2 = seed_distances(iris, x)
    back = cut.back.model
    classes = ctx.prep.y_train if ctx.prep.y_train is not None else _predict(back, x, ctx.prep.dev)
    predicted = _predict(back, iris.iris, ctx.prep.dev)
    seeded = iris.seed_index >= 0
    seed_class = classes[iris.seed_index[seeded]]
    return {"seed_linf_median": _nanstat(linf, "median"), "seed_linf_mean": _nanstat(linf, "mean"),
            "seed_l2_median": _nanstat(l2, "median"), "seed_l2_mean": _nanstat(l2, "mean"),
            "b_target_class_fraction": float((predicted == classes).double().mean()),
            "b_seed_class_fraction": float((predicted[seeded] == seed_class).double().mean())
            if bool(seeded.any()) else float("nan")}


def _nanstat(values: Tensor, how: str) -> float:
    """The median (the mean of the middle two for an even count) or mean of the finite ``values (n,)``."""
    finite = values[torch.isfinite(values)]
    if not len(finite):
        return float("nan")
    return float(np.median(finite.numpy())) if how == "median" else float(finite.mean())


def _iri_inputs(ctx: _ArmContext, cut: _Cut, out: ArmRows, timer: Timer) -> Tensor:
    """The IRIs of A at ``cut.la`` for this seed (made once per layer of A and seed, timed as ``iri``,
    recorded in ``out`` with their diagnostics)."""
    key = (ctx.run.seed, cut.la)
    if key not in out.iri_sets:
        with timer("iri"):
            out.iri_sets[key], out.iri_cache[key] = generate_iris(
                cut.front, ctx.prep.x_train, ctx.iri_settings, value_range=ctx.value_range,
                seed=ctx.run.seed, cache_dir=ctx.options.cache_dir,
                key_parts={"model": ctx.fp_a, "layer": cut.la, "data": ctx.data_key},
                progress=ctx.options.progress, description=f"IRIs A.{cut.la}{_seed_text(ctx.run)}")
        out.iri_diagnostics[key] = _iri_diagnostics(ctx, cut, out.iri_sets[key])
    return out.iri_sets[key].iris


def _seed_text(run: _SeedRun) -> str:
    return f" seed={run.seed}" if run.suffix else ""


def _phase_count(settings: StitchSettings, pairs: Sequence[tuple[str, str]], objectives: Sequence[str]) -> int:
    """The overall bar's phases: per seed, training A and B (``train`` > 0), the IRIs of each layer of A
    (``iri``) and every pair × arm × objective (as :func:`_models` and :func:`_arms` name them)."""
    arms = 2 if settings.iri else 1
    per_seed = (2 if settings.train > 0 else 0) + (len({la for la, _ in pairs}) if settings.iri else 0)
    return len(settings.seed_list()) * (per_seed + len(pairs) * arms * len(objectives))


def _init_state(ctx: _ArmContext, cut: _Cut, inputs: Tensor, timer: Timer) -> tuple[dict[str, Tensor], float]:
    """(initial stitch state, DM residual): least squares on ``inputs`` (timed as ``lstsq``) or the
    layer's own init (residual NaN)."""
    stitch0 = StitchLayer(cut.shape_a, cut.shape_b, cut.layout).to(ctx.prep.dev)
    if ctx.prep.settings.init == "lstsq":
        with timer("lstsq"):
            return _lstsq_state(cut.front, cut.back, stitch0, inputs, 256, ctx.prep.dev)
    return {k: v.clone() for k, v in stitch0.state_dict().items()}, float("nan")


def _validation(prep: Prepared, objective: str, stitched: StitchedModel) -> ValidationMonitor | None:
    """The monitor that scores a stitch on the validation split every ``val_every`` steps (None when
    validation is off): the stitched accuracy on the validation labels, or, without labels, minus the
    objective's loss on the validation inputs. Step 0 (the initial stitch) is scored first, so a stitch
    that training only makes worse keeps its init (``chosen_step`` 0)."""
    x_val, y_val = prep.x_val, prep.y_val
    if x_val is None or prep.settings.val_every <= 0:
        return None
    if y_val is not None:
        def score() -> float:
            return _accuracy(stitched, x_val, y_val)
        higher = True
    else:
        loss = StitchLoss(objective, stitched)

        def score() -> float:
            with torch.no_grad():
                total = sum(float(loss((xb.to(prep.dev),))) * len(xb) for xb in _batches(x_val, 512))
            return total / len(x_val)
        higher = False
    monitor = ValidationMonitor(score, prep.settings.val_every, higher_is_better=higher)
    first = score()
    monitor.scores, monitor.best, monitor.best_step = [(0, first)], first, 0
    monitor.best_state = {k: v.detach().clone() for k, v in stitched.stitch.state_dict().items()}
    return monitor


def _train_objective(ctx: _ArmContext, cut: _Cut, arm: str, objective: str, inputs: Tensor,
                     init: tuple[dict[str, Tensor], float], out: ArmRows, timer: Timer) -> None:
    """Train one stitch from ``init`` on ``inputs`` with ``objective`` (timed as ``train``; with
    validation, the best-scoring step's stitch is kept), evaluate it (``evaluate``) and add its rows to
    ``out``."""
    prep, (init_state, residual) = ctx.prep, init
    layer = StitchLayer(cut.shape_a, cut.shape_b, cut.layout).to(prep.dev)
    layer.load_state_dict(init_state)
    stitched = StitchedModel(cut.front, layer, cut.back)
    seed_text = _seed_text(ctx.run)
    config = _train_config(prep.settings, ctx.run.seed, ctx.options.progress,
                           f"{arm} {objective} A.{cut.la}→B.{cut.lb}{seed_text}")
    data_t = (inputs, prep.y_train) if prep.y_train is not None else (inputs,)
    with timer("train"):
        monitor = _validation(prep, objective, stitched)
        args = (layer, StitchLoss(objective, stitched), data_t, config, ctx.checkpoints,
                _check_name(f"stitch_{cut.la}__{cut.lb}__{objective}__{arm}{ctx.run.suffix}"), ctx.options.resume)
        history = _fit(*args) if monitor is None else _fit(*args, monitor)
        if monitor is not None:
            monitor.restore_best(layer)
    chosen = monitor.best_step if monitor is not None else history.steps
    with timer("evaluate"):
        acc = _accuracy(stitched, prep.x_test, prep.y_test)
    names = {"layer_a": cut.la, "layer_b": cut.lb, "objective": objective, "setting": arm}
    out.rows.append({**names, "stitched_accuracy": acc, "b_accuracy": ctx.b_acc, "penalty": ctx.b_acc - acc,
                     "seed": ctx.run.seed, "a_accuracy": ctx.a_acc,
                     "penalty_min": min(ctx.a_acc, ctx.b_acc) - acc, "chosen_step": chosen})
    out.train_rows.append({**names, "steps": history.steps,
                           "final_loss": history.losses[-1] if history.losses else float("nan"),
                           "lstsq_dm_residual": residual, "cut": cut.back.mode, "seed": ctx.run.seed,
                           "chosen_step": chosen,
                           "val_score": float(monitor.best) if monitor is not None and monitor.best is not None
                           else float("nan")})


def _arms(ctx: _ArmContext, plan: list[_Cut], out: ArmRows, timer: Timer) -> None:
    """Every pair × arm × objective of one seed, in that order (the order of every random draw); each
    a phase of the overall bar, as are the IRIs of each layer of A."""
    seeds, objectives = seed_position(ctx.run.seed, ctx.prep.settings.seed_list()), ctx.prep.objectives
    for k, cut in enumerate(plan, 1):
        out.cut_modes[f"{cut.la}->{cut.lb}"] = (cut.back.mode if cut.back.mode == "cut"
                                                 else f"replace ({cut.back.reason})")
        for arm in out.arms:
            if arm == "iri" and (ctx.run.seed, cut.la) not in out.iri_sets:
                phase(f"IRIs of A.{cut.la}{seeds}")
            inputs = _iri_inputs(ctx, cut, out, timer) if arm == "iri" else ctx.prep.x_train
            init = _init_state(ctx, cut, inputs, timer)
            for j, objective in enumerate(objectives, 1):
                phase(f"objective {j} of {len(objectives)} ({objective}) · {arm} arm · pair {k} of {len(plan)}{seeds}")
                _train_objective(ctx, cut, arm, objective, inputs, init, out, timer)


def _seed_models(model_a: ModelSource, model_b: ModelSource, settings: StitchSettings) -> str:
    """How the seeds' models differ, for ``meta.seed_models``."""
    built = not isinstance(model_a, nn.Module) or not isinstance(model_b, nn.Module)
    how = "built for each seed" if built else "the given models"
    if settings.train > 0:
        how += ", trained for each seed (own batch order)"
    return how


def stitch(model_a: ModelSource, model_b: ModelSource, data: Dataset, settings: StitchSettings | None = None, *,
           test_data: Dataset | None = None, run_dir: RunDir | str | Path | None = None, resume: bool = False,
           device: str | torch.device = "cpu", progress: bool = True,
           cache_dir: str | Path | None = DEFAULT_CACHE,
           names: Sequence[str] = ("model_a", "model_b")) -> StitchResult:
    """Stitch A's front half into B's back half at each layer pair; standard and (with ``iri``) IRI arms.

    model_a / model_b: the front (A) and back (B) models, or factories ``model(seed) -> nn.Module``
    called once per seed of ``settings.seed_list()`` (the CLI passes factories that build A with
    ``seed`` and B with ``seed + 1``, :func:`simkit.seeding.pair_seeds`); never modified (halves work
    on frozen copies; with ``settings.train`` > 0 copies are trained first, once per seed).
    data: a simkit Dataset (labels needed for HLM, ``train`` and accuracies); without ``test_data`` its
    native test split (or a seeded 80/20 split) is the evaluation set and the rest trains the stitches
    and seeds IRIs (less the validation split with ``settings.val_every`` > 0).
    test_data: an evaluation set of its own (its native test split when it has one, else all of it;
    labelled, samples shaped as ``data``'s); all of ``data``'s own samples then train the stitches.
    settings: what decides the numbers (:class:`StitchSettings`; default: the command's defaults).
    run_dir / resume: checkpoints of every stitch under ``run_dir/checkpoints`` and resume from them
    (a path is checked against the settings and fingerprints of the (first seed's) models and the data,
    so a resume with other inputs is refused; a :class:`~simkit.rundir.RunDir` is used as it is).
    device: cpu, cuda or cuda:N. progress: progress bars. cache_dir: IRI cache (None: no cache).
    names: the models' names in the result (the CLI passes the specs).
    """
    timer = Timer()
    settings = checked_settings(settings)
    seeds = settings.seed_list()
    first_a, first_b = build_model(model_a, seeds[0], "model_a"), build_model(model_b, seeds[0], "model_b")
    check_arguments(first_a, first_b, data)
    name_a, name_b = (str(name) for name in names)
    prep = prepare(first_a, first_b, data, settings, test_data, (name_a, name_b), device, timer)
    _train_config(settings, settings.seed, progress, "check").validate()
    setup = _setup(first_a, first_b, prep, run_dir, resume)
    options = _Options(resume=resume, progress=progress, cache_dir=cache_dir)
    data_key = f"{data.spec}|n={len(prep.train)}|{tensor_digest(prep.x_train)}"
    out = ArmRows(arms=["standard"] + (["iri"] if settings.iri else []))
    trained: list[tuple[nn.Module, nn.Module]] = []
    built = len(seeds) if _seed_models(model_a, model_b, settings).startswith("built") else 1
    weights = {side: weights_words(net, settings.train, built) for side, net in (("A", first_a), ("B", first_b))}
    with overall_progress(_phase_count(settings, prep.pairs, prep.objectives), enabled=progress):
        for i, seed in enumerate(seeds):
            run = _SeedRun(seed, f"_s{seed}" if len(seeds) > 1 else "")
            net_a, net_b = (first_a, first_b) if i == 0 else (build_model(model_a, seed, "model_a"),
                                                               build_model(model_b, seed, "model_b"))
            plan = setup.plan if i == 0 else _cut(net_a, net_b, prep.pairs, setup.probe, prep.tokens, prep.dev)
            net_a, net_b, plan = _models(net_a, net_b, plan, prep, setup, options, run, timer)
            with timer("evaluate"):
                a_acc = _accuracy(frozen_copy(net_a).to(prep.dev), prep.x_test, prep.y_test)
                b_acc = _accuracy(plan[0].back.model, prep.x_test, prep.y_test)
            out.accuracies.append({"seed": seed, "a_accuracy": a_acc, "b_accuracy": b_acc})
            ctx = _ArmContext(prep=prep, options=options, checkpoints=setup.checkpoints, run=run, a_acc=a_acc,
                              b_acc=b_acc, iri_settings=settings.iri_settings(), value_range=setup.value_range,
                              data_key=data_key, fp_a=weights_digest(net_a) if settings.iri else "")
            _arms(ctx, plan, out, timer)
            trained.append((net_a, net_b))
    facts = RunFacts(model_a=trained[0][0], model_b=trained[0][1], value_range=setup.value_range,
                     range_source=setup.range_source, cache_dir=cache_dir,
                     a_acc=float(np.mean([r["a_accuracy"] for r in out.accuracies])),
                     b_acc=float(np.mean([r["b_accuracy"] for r in out.accuracies])),
                     seeds=seeds, seed_models=_seed_models(model_a, model_b, settings), weights=weights)
    return assemble(prep, facts, out, timer)


def _train_config(settings: StitchSettings, seed: int, progress: bool, description: str) -> TrainConfig:
    return TrainConfig(steps=settings.steps, batch_size=settings.batch_size, lr=settings.lr, optimizer="adam",
                       seed=seed, progress=progress, description=description)


def _fit(stitch: StitchLayer, loss: StitchLoss, data: tuple[Tensor, ...], config: TrainConfig,
         run_dir: Path | None, name: str, resume: bool, monitor: ValidationMonitor | None = None) -> TrainHistory:
    return fit(stitch, loss, data, config, params=list(stitch.parameters()), run_dir=run_dir, name=name,
               resume=resume, monitor=monitor)
