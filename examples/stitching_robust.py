"""Standard vs invariance-aware stitching between adversarially trained (robust) and standard models.

Design (issue #39, experiment 1: the IRIs bounded; written before the run. Data, models and scores as
in the earlier design below; what changes is the IRI search, the gate before any stitch and the seeds.)

Why. The earlier run (issue #24, below) never tested the premise that a standard front's IRIs are its
seed plus a small non-robust perturbation: the IRI search had no bound around the seed (Adam at lr 0.1
in data units, a clamp to [0, 1] only, restarts from fresh seeds), so both fronts' IRIs ended a median
L∞ 0.91-0.97 from their seeds and B labelled 93-98 % of them as the target's class, whatever the front.
Claims 2 and 3 were then built to fail. Now every IRI stays in an L∞ ball around the training input it
starts from (``iri_radius`` ε, projected Adam steps of 0.1·ε, 300 steps, 3 restarts from new seeds, each
in its own ball; tolerance 0.05, the same search for every front); an IRI that misses the tolerance
inside its ball is counted as not reached and kept where it is.

Radii. ε ∈ {0.1, 0.2} in input units: 0.1 is the robust models' training and evaluation budget (a
standard model is ≤ 20 % accurate under PGD-10 there, so its features should move within it), 0.2 is
twice that (a robust model's features should still mostly not).

Gate (before any stitch; seed 0's four models; both stitch layers fc1_relu and fc2_relu; per ε):
- the standard front N reaches the tolerance inside ε on at least half of its IRIs
  (``reached_inside_radius_fraction`` ≥ 0.5) at both layers;
- the robust front R mostly does not (< 0.5) at both layers;
- B = R labels N's IRIs as their seed's class more often than as their target's (N→R,
  ``b_seed_class_fraction`` > ``b_target_class_fraction``) at both layers.
The full run stitches at every ε whose gate passes. If neither passes at 16×16, the issue's fallback
(below) is run; if its gate fails too, the claims are reported as "not testable at this scale" with the
gate's numbers.
``--gate`` runs the gate alone (seed 0's models, then the bounded IRIs of the fronts N (read by B = R and
B = N′) and R (B = R′) at both layers and both radii, through ``simkit.stitch`` with no stitch training)
and writes its table to ``examples/results/stitching_robust_gate.txt``.

Gate run (seed 0, after this design was written): it FAILED at both radii. N reached the tolerance
inside ε on 6-9 % of its IRIs at ε 0.1 and 28-41 % at ε 0.2 (R: 6-7 % and 23-26 %); at ε 0.2 R labels
N's IRIs as the seed's class about as often as the target's (63-65 % against 60 %), while N′ labels
them as the target's 90 %. The IRIs took 987 s for one seed on one thread, so the 5-seed run cannot fit
30 minutes as designed.

Fallback (issue #39: "stitch at an earlier layer or use 32×32 inputs"; chosen after the 16×16 gate failed
and before running it): 32×32 inputs, one fallback only (the earlier plan of pool2 first is dropped).
Why 32×32 and not an earlier layer. At 16×16 the standard front missed the tolerance inside ε about as
often as the robust one (N 6-9 %, R 6-7 % at ε 0.1): a 5 % relative match of all 64 (fc1_relu) or 32
(fc2_relu) features of another input is a far stronger demand than flipping the class, and 256 input
values inside a small L∞ ball do not give a standard model's features that much room. How far an L∞ ball
can move a non-robust model's features grows with the number of input values it spans (the first-order
change is ε‖∇‖₁, a sum over the pixels), so 32×32 gives 4× the values at the same ε and the same 64 and
32 features, while R is trained against exactly that ball. An earlier layer works the other way: pool2
has 32×4×4 = 512 features at 16×16, twice the 256 input values, so matching another input's pool2
inside a ball is nearly impossible for any front (fewer reached, for N and R alike), which cannot
separate them.
Gate at 32×32 (``--gate32``; seed 0; written before it runs). Models N, R, N′ at side 32 (PoolCNN,
fc1_relu 64, fc2_relu 32 features; training as below). Preconditions as below (N, N′ ≤ 20 % under PGD-10
at eps 0.1, R ≥ 60 %). IRIs: the same search as the 16×16 gate (library defaults: Adam at 0.1·ε, 300
steps, 3 restarts, tolerance 0.05), of 256 training inputs drawn by seed 0 (not all 1437: a step costs
about 4× at 32×32, and 256 give each fraction a standard error ≤ 3.1 points), fronts N (read by B = R and
B = N′) and R (read by B = N; R's reached fraction does not depend on B, so R′ is not trained for the
gate), both layers, ε 0.1 and 0.2. The gate's conditions are those above, with R->N for R's reached
fraction. Beside them the table gives the fraction reached inside ε within the first 100 steps of the
first attempt (``reached_first100``), from each IRI's step count: the full run must cut the search to fit
20 minutes at one thread, and it goes ahead only at an ε where the gate also passes on that cut (the run's
budget is then fixed from the gate's timing and written here before it runs). Writes
``examples/results/stitching_robust_gate_32.txt``; the 16×16 gate's file stays as it is.

Claims (IRI arm, penalty_min, SLM/DM/FuLA, fc1_relu + fc2_relu, per ε that passed the gate; paired
per-seed differences, 95 % t interval, the verdict rule below):
- Claim 2: N→R and N→N′ each more than 10 points worse than R→R′;
- Claim 3: the order R→R′ < R→N < N→R (both differences above 0).
Claim 1 (standard arm) is unchanged and shown once. IRI diagnostics per pair, layer and ε: reached
fraction inside ε, median L∞ from the seed, B's seed-class and target-class fractions.

Budget. 5 seeds (0-4; the effects of the earlier run were within 3 SD), stitches as below (200 Adam
steps, validation every 20). Sized from the gate's IRI time: at most 30 minutes on an idle 2-core
machine, one torch thread; if the gate's timing says more, the stitch steps are halved before the run.

Earlier design (issue #24, experiment 2; superseded for claims 2 and 3 by the unbounded IRI search
described above; its verdicts stay in examples/results/stitching_robust.txt under "earlier run")

Question. A robust model never learned the non-robust (small-perturbation) features of its data;
a standard model relies on them. Standard stitching only asks whether A's features can drive B, so it
should rate robust and standard models compatible; invariance-aware stitching also asks whether B is
invariant to what A ignores. A standard model's IRIs (inputs it represents like x) should stay close
to their seed image, differing from it by non-robust perturbations that another model does not read
as x; a robust model's IRIs must carry x's robust, perceptible features.

Data. The digits (8×8) upsampled bilinearly to 16×16 (values in [0, 1]): on 8×8 a standard model kept
42 % accuracy under PGD-10 at eps 0.1 (not truly non-robust); a one-seed probe at 16×16 (before this
design) gave 12 % for a standard and 66 % for a robust model. Stitching data: the training split
(1437), of which 10 % (drawn by seed 0) is the validation split that picks each stitch's step;
evaluation: the test split (360).

Models (the ``PoolCNN`` of ``stitching_shortcut.py`` at side 16: stitch points fc1_relu 64, fc2_relu
32; 800 Adam steps, lr 3e-3, weight decay 1e-2, batch 128), four per seed: R, R′ trained
on L∞ PGD examples (eps 0.1, 5 steps of 2.5·eps/5, no random start), N, N′ on clean inputs.
Preconditions (printed and checked before any stitch): N, N′ ≤ 20 % accuracy under PGD-10 at eps 0.1
on the evaluation data; R, R′ ≥ 60 %. If one fails, the claims are reported as "precondition failed".

Arms. Pairs R→R′, R→N, N→R, N→N′, each at fc1_relu and fc2_relu (the deeper layers the claims are
about; pool1 and pool2 are left out to fit the budget), standard vs invariance-aware (IRIs: the
library defaults, Adam with 3 restarts, tolerance 0.05), HLM, SLM and DM at both layers and FuLA at
fc1_relu (at the last stitched layer it is DM).

Score. ``penalty_min`` = min(A's, B's accuracy) − stitched accuracy on the evaluation data, in points,
for every claim: the claims compare pairs whose models differ in clean accuracy, and a stitch cannot be
asked to beat its weaker half. ``penalty`` (against B) is printed beside it.

Budget. 3 seeds (0-2: models, IRIs, stitch init and batch order; validation split drawn by seed 0).
Every stitch in every arm: least-squares init, then 200 Adam steps (lr 2e-3, batch 128), scored on
the validation split at step 0 and every 20 steps, the best step kept. Sized by a 1-seed smoke run
(50 steps; about 14 ms per stitch step with validation, 17 s of IRIs per front and seed, 140 s to
train a seed's four models, one torch thread) to fit 20 minutes on an idle 2-core machine.

Claims (paired per-seed differences in points, averaged within a seed over fc1_relu and fc2_relu and
the named objectives; 95 % t interval; "reproduced" when the interval lies on the claimed side of the
size, "direction only" when only the mean does, else "not reproduced"; a claim takes its weakest
comparison):
- Claim 1 (standard arm, every objective scored there): R→N, N→R and N→N′ each at most 5 points
  worse than R→R′ (difference below +5).
- Claim 2 (IRI arm, SLM/DM/FuLA): N→R and N→N′ (standard front) each more than 10 points worse than
  R→R′.
- Claim 3 (IRI arm, SLM/DM/FuLA): the order R→R′ < R→N < N→R (both differences above 0).
IRI diagnostics (``iris.csv`` per layer, summarised per pair and layer), expected: a standard front's
IRIs stay closer to their seed (median L∞ distance of N→R's below R→R′'s, fc1_relu + fc2_relu) and are
labelled by B as their target's class less often (N→R's target fraction below R→R′'s).

Expected (the paper): claims 1-3 reproduced.

    .venv/bin/python examples/stitching_robust.py --gate      # the gate of issue #39 alone (seed 0, 16x16)
    .venv/bin/python examples/stitching_robust.py --gate32    # its 32x32 fallback (seed 0)
    .venv/bin/python examples/stitching_robust.py --out runs/stitching_robust   # the earlier design's run

Writes each pair's run (``<out>/<pair>/report.html``, all seeds), the per-seed table
``examples/results/stitching_robust_table.csv`` and the text summary
``examples/results/stitching_robust.txt`` (``--results``); ``--gate`` writes
``examples/results/stitching_robust_gate.txt``, ``--gate32`` ``examples/results/stitching_robust_gate_32.txt``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from safetensors import safe_open
from stitching_shortcut import (
    ALL_OBJECTIVES,
    DEEP,
    IRI_OBJECTIVES,
    Claim,
    RunClock,
    StitchPlan,
    compare,
    iri_table,
    parse_args,
    penalty_tables,
    per_seed,
    stitch_pair,
    train_model,
    write,
)
from torch import nn

import simkit
from simkit.data import Dataset, load_data

SIDE = 16
LAYERS = ("fc1_relu", "fc2_relu")
PAIRS = (("R", "R2"), ("R", "N"), ("N", "R"), ("N", "N2"))
MODELS = ("R", "R2", "N", "N2")
EPS, TRAIN_PGD_STEPS, EVAL_PGD_STEPS = 0.1, 5, 10
STANDARD_ROBUST_MAX, ROBUST_ROBUST_MIN = 0.20, 0.60
RADII = (0.1, 0.2)  # the IRI balls (L∞, input units) of issue #39's experiment 1
GATE_PAIRS = (("N", "R"), ("N", "N2"), ("R", "R2"))  # the standard front (B = R and N′) and the robust front
GATE_REACHED = 0.5  # the standard front reaches the tolerance inside ε on at least this fraction; R below it
FIRST_ATTEMPT_CUT = 100  # the gate also reports the fraction reached within this many steps of the first attempt


@dataclass(frozen=True)
class GateSpec:
    """One gate of the docstring: input side, the models it trains (seed 0), the (front, back) pairs whose
    IRIs it makes, the pair that gives the robust front's reached fraction, how many training inputs the IRIs
    are made for (None: all), and where its table goes."""

    side: int
    models: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]
    robust_pair: str
    inputs: int | None
    results: Path


GATE_16 = GateSpec(SIDE, MODELS, GATE_PAIRS, "R->R2", None, Path("examples/results/stitching_robust_gate.txt"))
GATE_32 = GateSpec(32, ("R", "N", "N2"), (("N", "R"), ("N", "N2"), ("R", "N")), "R->N", 256,
                   Path("examples/results/stitching_robust_gate_32.txt"))
INIT_INDEX = {name: k for k, name in enumerate(MODELS)}  # a model's init seed is 100·seed + this, in every design


def upsampled_digits(side: int = SIDE) -> Dataset:
    """The digits upsampled bilinearly to ``side``×``side`` (clamped to [0, 1]), native test split kept."""
    digits = load_data("digits")
    train_part, test = digits.train_test()

    def up(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False).clamp(0, 1)
    info = {**digits.info, "input_shape": (1, side, side)}
    evaluation = Dataset(up(test.inputs), test.labels, f"digits {side}x{side} test", info=info)
    return Dataset(up(train_part.inputs), train_part.labels, f"digits {side}x{side}", test=evaluation, info=info)


def check_models(models: dict[tuple[str, int], nn.Module], test: Dataset) -> tuple[list[str], list[dict], set[str]]:
    """Clean and PGD-10 accuracy of every model on the evaluation data: (lines, rows, the kinds (R, N)
    failing their precondition)."""
    lines, rows, failed = [], [], set()
    for (name, seed), model in models.items():
        clean = simkit.evaluate_accuracy(model, test.inputs, test.labels)
        robust = simkit.robust_accuracy(model, test.inputs, test.labels, eps=EPS, steps=EVAL_PGD_STEPS)
        kind = name.rstrip("2")
        ok = robust >= ROBUST_ROBUST_MIN if kind == "R" else robust <= STANDARD_ROBUST_MAX
        failed |= set() if ok else {kind}
        rows.append({"model": kind, "seed": seed, "clean": clean, "robust": robust})
        lines.append(f"  seed {seed} {name}: clean {clean:.3f}, PGD-{EVAL_PGD_STEPS} eps {EPS} {robust:.3f}  "
                     + ("ok" if ok else "FAILED"))
    return lines, rows, failed


def claims(table: pd.DataFrame, failed: set[str]) -> list[Claim]:
    """Claims 1-3 of the docstring from the stitching rows of every pair and seed."""
    def cell(pair: str, setting: str) -> pd.Series:
        objectives = ALL_OBJECTIVES if setting == "standard" else IRI_OBJECTIVES
        return per_seed(table, pair, setting, objectives, DEEP, "penalty_min")
    blocked = f"precondition failed for {', '.join(sorted(failed))} (see the model checks)" if failed else None
    one = Claim("Claim 1", "standard stitching rates every pair about as compatible as R->R2 (penalty_min, "
                "standard arm, fc1_relu + fc2_relu, all objectives scored there; at most 5 points worse)",
                [compare(f"{p} − R->R2", cell(p, "standard"), cell("R->R2", "standard"), False, -5.0)
                 for p in ("R->N", "N->R", "N->N2")], blocked)
    two = Claim("Claim 2", "invariance-aware stitching scores pairs with a standard front > 10 points worse than "
                "R->R2 (penalty_min, IRI arm, fc1_relu + fc2_relu, SLM/DM/FuLA)",
                [compare(f"{p} − R->R2", cell(p, "iri"), cell("R->R2", "iri"), True, 10.0)
                 for p in ("N->R", "N->N2")], blocked)
    three = Claim("Claim 3", "invariance-aware order R->R2 < R->N < N->R (penalty_min, IRI arm, same cells)",
                  [compare("R->N − R->R2", cell("R->N", "iri"), cell("R->R2", "iri"), True, 0.0),
                   compare("N->R − R->N", cell("N->R", "iri"), cell("R->N", "iri"), True, 0.0)], blocked)
    return [one, two, three]


def diagnostics(iris: pd.DataFrame) -> Claim:
    """The expected IRI diagnostics as paired comparisons (fc1_relu + fc2_relu, N->R vs R->R2)."""
    def value(pair: str, name: str) -> pd.Series:
        part = iris[(iris.pair == pair) & iris.layer_a.isin(DEEP)]
        return part.groupby("seed")[name].mean()
    return Claim("IRI diagnostics", "a standard front's IRIs stay closer to their seed and B labels them as their "
                 "target less often (N->R vs R->R2, fc1_relu + fc2_relu; L∞ in input units, fractions)",
                 [compare("median L∞ from seed, N->R − R->R2", value("N->R", "seed_linf_median"),
                          value("R->R2", "seed_linf_median"), False, 0.0, points=False),
                  compare("target-class fraction, N->R − R->R2", value("N->R", "b_target_class_fraction"),
                          value("R->R2", "b_target_class_fraction"), False, 0.0, points=False)])


def gate_rows(models: dict[tuple[str, int], nn.Module], data: Dataset, cache: Path,
              pairs: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    """The gate's IRI diagnostics: for every radius and gate pair, seed 0's IRIs of the front at both stitch
    layers, made by ``simkit.stitch`` with no stitch training (least squares only; the stitches are not
    scored here), one row per (ε, pair, layer), with the first-attempt cut of :func:`first_attempt_reached`."""
    rows = []
    for radius in RADII:
        for front, back in pairs:
            settings = simkit.StitchSettings(layer_a=list(LAYERS), layer_b=list(LAYERS), objective=["dm"], iri=True,
                                             steps=0, seed=0, iri_radius=radius, iri_norm="linf")
            folder = cache / f"eps{radius:g}-{front}"  # one folder per front and radius: its files are per layer
            result = simkit.stitch(models[(front, 0)], models[(back, 0)], data, settings, cache_dir=folder,
                                   progress=False, names=(front, back))
            cut = first_attempt_reached(folder)
            rows += [{"eps": radius, "pair": f"{front}->{back}", **row, "reached_first100": cut[row["layer_a"]]}
                     for row in result.tables["iris"].to_dict("records")]
            print(f"gate eps {radius} {front}->{back}: done", flush=True)
    return pd.DataFrame(rows)


def first_attempt_reached(folder: Path) -> dict[str, float]:
    """Per layer, the fraction of the IRIs cached in ``folder`` that reached the tolerance within the first
    ``FIRST_ATTEMPT_CUT`` steps of their first attempt (a reached IRI stops at the step it reaches it, and a
    restart's steps count from the end of the earlier attempts; every bounded IRI is inside its ball)."""
    out = {}
    for path in sorted(folder.glob("iri-*.safetensors")):
        if path.name.endswith(".partial.safetensors"):
            continue
        with safe_open(str(path), "pt") as f:
            layer = f.metadata()["layer"]
            error, steps, tol = f.get_tensor("rel_error"), f.get_tensor("steps"), simkit.StitchSettings().iri_tol
        out[layer] = float(((error <= tol) & (steps <= FIRST_ATTEMPT_CUT)).double().mean())
    return out


def gate_verdicts(rows: pd.DataFrame, robust_pair: str, reached: str = "reached_inside_radius_fraction"
                  ) -> dict[float, list[str]]:
    """Per radius, the gate's failed conditions (empty: it passes), from :func:`gate_rows`; ``robust_pair``
    gives R's reached fraction, ``reached`` the column judged (the full search or its first-attempt cut)."""
    failed: dict[float, list[str]] = {}
    for radius, part in rows.groupby("eps"):
        def at(pair: str, column: str, part: pd.DataFrame = part) -> pd.Series:
            return part[part.pair == pair].set_index("layer_a")[column]
        reasons = []
        if not (at("N->R", reached) >= GATE_REACHED).all():
            reasons.append(f"N reaches the tolerance inside eps on < {GATE_REACHED:.0%} at some layer")
        if not (at(robust_pair, reached) < GATE_REACHED).all():
            reasons.append(f"R reaches it on >= {GATE_REACHED:.0%} at some layer")
        if not (at("N->R", "b_seed_class_fraction") > at("N->R", "b_target_class_fraction")).all():
            reasons.append("R labels N's IRIs as the target's class at least as often as the seed's at some layer")
        failed[float(radius)] = reasons
    return failed


def iri_subset(data: Dataset, spec: GateSpec) -> Dataset:
    """The gate's stitching data (the inputs its IRIs are made for): ``data`` (the training split the models
    learn from), or ``spec.inputs`` of its inputs drawn by seed 0 (the test split kept)."""
    if spec.inputs is None:
        return data
    pick = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:spec.inputs]
    assert isinstance(data.inputs, torch.Tensor) and data.labels is not None
    return Dataset(data.inputs[pick], data.labels[pick], f"{data.spec} ({spec.inputs} drawn by seed 0)",
                   test=data.test, info=data.info)


def verdict_lines(rows: pd.DataFrame, spec: GateSpec) -> list[str]:
    """The gate's verdict per ε on the full search and (where the table has it) on the first-attempt cut."""
    lines = []
    for label, column in (("", "reached_inside_radius_fraction"), (f" (first {FIRST_ATTEMPT_CUT} steps of the "
                                                                    "first attempt)", "reached_first100")):
        if column not in rows:
            continue
        for radius, reasons in gate_verdicts(rows, spec.robust_pair, column).items():
            lines.append(f"GATE eps {radius:g}{label}: "
                         + ("passes" if not reasons else "fails: " + "; ".join(reasons)))
    return lines


def run_gate(args, spec: GateSpec) -> None:
    """``--gate`` / ``--gate32``: seed 0's models, their preconditions, and the gate's table and verdict per ε."""
    clock = RunClock()
    data = upsampled_digits(spec.side)
    assert data.test is not None
    models = {(name, 0): train_model(INIT_INDEX[name], data, args.train_steps, f"{name} seed 0", side=spec.side,
                                     eps=EPS if name.startswith("R") else 0.0, pgd_steps=TRAIN_PGD_STEPS)
              for name in spec.models}
    checks, _, failed = check_models(models, data.test)
    trained = time.perf_counter() - clock.started
    stitching = iri_subset(data, spec)
    rows = gate_rows(models, stitching, args.out / f".iri-cache-gate{spec.side}", spec.pairs)
    columns = ["eps", "pair", "layer_a", "reached_inside_radius_fraction", "reached_first100", "distance_median",
               "seed_linf_median", "b_seed_class_fraction", "b_target_class_fraction", "median"]
    lines = ["Gate of issue #39 experiment 1 (bounded IRIs, L∞ ball eps around the seed; seed 0; tolerance "
             f"{simkit.StitchSettings().iri_tol}; {spec.side}x{spec.side} digits; IRIs of "
             f"{len(stitching)} training inputs; models trained on all {len(data)})", "", "Model checks:", *checks,
             f"Preconditions: {'FAILED for ' + ', '.join(sorted(failed)) if failed else 'all met'}", "",
             rows[columns].rename(columns={"median": "rel_error_median"}).to_string(index=False, float_format="%.3f"),
             "", *verdict_lines(rows, spec)]
    lines += ["", f"time: models {trained:.0f} s, IRIs {time.perf_counter() - clock.started - trained:.0f} s "
              f"(torch threads {torch.get_num_threads()})", *clock.lines()]
    spec.results.parent.mkdir(parents=True, exist_ok=True)
    spec.results.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    gates = {"--gate": GATE_16, "--gate32": GATE_32}  # the shared command line of the stitching examples has none
    gate = next((gates[flag] for flag in gates if flag in sys.argv), None)
    sys.argv = [a for a in sys.argv if a not in gates]
    args = parse_args("stitching_robust", seeds=3, description=__doc__.splitlines()[0])
    if gate is not None:
        torch.set_num_threads(args.threads)
        run_gate(args, gate)
        return
    torch.set_num_threads(args.threads)
    clock = RunClock()
    data = upsampled_digits()
    assert data.test is not None
    models = {(name, seed): train_model(100 * seed + INIT_INDEX[name], data, args.train_steps, f"{name} seed {seed}", side=SIDE,
                                        eps=EPS if name.startswith("R") else 0.0, pgd_steps=TRAIN_PGD_STEPS)
              for seed in range(args.seeds) for name in MODELS}
    checks, rows, failed = check_models(models, data.test)
    accuracy = pd.DataFrame(rows).groupby("model")[["clean", "robust"]].agg(["mean", "std"]).round(3)
    lines = [__doc__.splitlines()[0], "", f"Model checks (evaluation data; preconditions: PGD-{EVAL_PGD_STEPS} at "
             f"eps {EPS} <= {STANDARD_ROBUST_MAX} for N, N2 and >= {ROBUST_ROBUST_MIN} for R, R2):", *checks,
             "Mean and std over both inits and all seeds:", accuracy.to_string(),
             f"Preconditions: {'FAILED for ' + ', '.join(sorted(failed)) if failed else 'all met'}", ""]
    print("\n".join(lines), flush=True)
    plan = StitchPlan(LAYERS, args.seeds, args.stitch_steps, args.val_every, args.stitch_lr, args.out,
                      args.out / ".iri-cache")
    frames, iri_frames, warned = [], [], []
    for front, back in PAIRS:
        label = f"{front}->{back}"
        stitched, iris, w = stitch_pair(plan, label, lambda s, m=front: models[(m, s)],
                                        lambda s, m=back: models[(m, s)], data)
        frames.append(stitched)
        iri_frames.append(iris)
        warned += w
        print(f"{label}: done at {time.perf_counter() - clock.started:.0f} s", flush=True)
    table, iris = pd.concat(frames, ignore_index=True), pd.concat(iri_frames, ignore_index=True)
    lines += [f"Stitch budget: {args.stitch_steps} Adam steps (lr {args.stitch_lr:g}) per stitch, validation every "
              f"{args.val_every} steps "
              f"(chosen step: mean {table.chosen_step.mean():.0f}, range {table.chosen_step.min()}-"
              f"{table.chosen_step.max()}); {args.seeds} seeds; layers {', '.join(LAYERS)}.",
              "", "VERDICTS (per-seed differences in points, paired by seed, 95 % t interval):"]
    for claim in [*claims(table, failed), diagnostics(iris)]:
        lines += claim.lines()
    lines += penalty_tables(table, LAYERS) + iri_table(iris, LAYERS)
    lines += ["", "Warnings:", *(warned or ["none"]), "", *clock.lines()]
    write(lines, table, args.results)


if __name__ == "__main__":
    main()
