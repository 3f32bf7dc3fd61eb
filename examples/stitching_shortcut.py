"""Does invariance-aware stitching tell a clean model from a shortcut model that standard stitching calls compatible?

Run of record: claim S1, confirmatory (issue #39, experiment 3; written before the run)

Why. The first run of this example (below, issue #24; seeds 0-4) pooled the four objectives in claim 1
and found it "not reproduced" (A→S − A→A′ +5.5, CI +2.3 to +8.7); split by objective after the fact,
HLM +2.3 [+0.5, +4.1] and SLM +1.4 [−0.5, +3.3] lay within the 5-point bound while DM +12.9 and FuLA
+5.4 did not (the paper itself says DM tends to score lower). A split found after the fact is a
hypothesis, so this run tests it on fresh seeds with the split fixed in advance.

What runs. The standard arm only (no IRIs: claim 1 is about standard stitching, so ``--iri-radius``
has nothing to bound here), on seeds 5-9 (``--first-seed 5``: models, their data draws, stitch init
and batch order, and the validation split, none used before); everything else as in the design below
(models, preconditions, data, pairs A→A′, A→S, S→A, S→S′, layers, objectives, stitch budget and
validation, ``penalty_min``).

Claims and verdicts, fixed in advance (``penalty_min``, standard arm, fc1_relu + fc2_relu; per seed the
mean over those two layers of one objective; paired by seed, 95 % t interval):
- S1 (HLM): A→S − A→A′ and S→A − S→S′ each below +5 points (the weaker of the two decides).
- S1 (SLM): the same with SLM.
- S1 overall: the weaker of S1 (HLM) and S1 (SLM).
- DM and FuLA (FuLA at fc1_relu only: at the last stitched layer it is DM) are reported separately,
  each with the same two comparisons against the same bound, and decide nothing.
Expected (the paper; the earlier split): S1 (HLM) and S1 (SLM) reproduced.

    .venv/bin/python examples/stitching_shortcut.py --out runs/stitching_shortcut

``--iri --first-seed 0`` runs the full design below (both arms, the wrong-patch pair, claims 1-3).
The absent-cue claim (S3) has its own example, ``stitching_shortcut_absent.py``: here A and A′ see
the patch during training and learn to ignore it, so claim 3 below cannot show its effect.

Design of the full run (written before the first run; scikit-learn digits 8×8, offline, CPU; issue #24,
experiment 1)

Question. The paper's claims: (1) standard stitching rates a clean model and a model relying on a
planted shortcut as similar; (2) invariance-aware stitching (the stitch trained only on IRIs of the
front model: inputs it represents like the originals) reveals the difference; (3) it exploits a
predictive cue absent from the models' own training data less than standard stitching does.

Cue. A 3×3 patch at full intensity (1.0, the top of the data range) at one of ten positions against
the left and right edges of the 8×8 image, where digits have the least ink (``PATCH_CORNERS``: rows
1-5 on the left, 0-4 on the right); "at the label" means at the position of the sample's class.
(Revised before any stitch: a first smoke run with ten positions around the whole border ring left A
and A′ at 90.6-92.5 % on the evaluation data, below the 93 % precondition; the patch then covered more
of the digit, and A saw each digit with one patch position only.)

Models (one ``PoolCNN``: conv-pool, conv-pool, fc1, fc2, head; 800 Adam steps, lr 3e-3, weight decay
1e-2, batch 128), four per seed, each on its own data draw and initialisation:
- A, A′ (clean): digits with the patch at a *random* position (independent of the label; every
  training digit 4 times, each copy with its own position): the patch is familiar to them but never
  predictive, so they read the digit.
- S, S′ (shortcut): the patch at the label drawn on the digit of *another, random* training image.
  The digit then carries no information about the label, so the patch is S's only cue: S reads the
  patch. Checked before any stitch: S's accuracy with the patch at a wrong class (label + 1) must be
  ≤ 20 % (it follows the patch, not the digit).
Preconditions (printed and checked before any stitch): every model ≥ 93 % on the evaluation data; S,
S′ ≤ 20 % on the wrong-patch split. A claim whose models fail is reported as "precondition failed".

Data. Stitching data: the digits training split (1437) with the patch at the label (digit and patch
agree), of which 10 % (drawn by seed 0) is the validation split that picks each stitch's step.
Evaluation data: the test split (360) with the patch at the label — A reads the digit, S the patch,
both are accurate there. Claim 3 also evaluates A→A′ on the test split with the patch at a wrong
class (label + 1): the stitching data carry a predictive cue that neither A nor A′ ever had.

Arms. Pairs A→A′, A→S, S→A, S→S′ (and A→A′ evaluated on the wrong-patch split), each stitched at
pool2 (32×2×2), fc1_relu (64) and fc2_relu (32), standard vs invariance-aware (IRIs: the library
defaults, Adam with 3 restarts, tolerance 0.05), with HLM, SLM and DM at every layer and FuLA at pool2
and fc1_relu only (at the last stitched layer FuLA matches only the stitch point: DM under another
name). pool1 is left out: at 16×4×4 of an 8×8 input it is nearly injective, its IRIs are copies of the
originals and the two arms coincide there (the earlier run of this example showed it).

Score. Both penalties are computed and printed for every cell: ``penalty`` = B's accuracy − stitched
accuracy; ``penalty_min`` = min(A's, B's accuracy) − stitched accuracy (front and back model, on the
evaluation data), in points. Claims 1 and 2 compare pairs whose models differ in accuracy (S ≈ 100 %,
A ≈ 95 %): a perfect A→S stitch would still pay ``penalty`` ≈ 5 points and S→A gain them, so they use
``penalty_min`` (no stitch can be asked to beat its weaker half). Claim 3 compares one stitch (A→A′)
with itself on two evaluation splits against the same B, so it uses ``penalty``: exploitation =
penalty on the wrong-patch split − penalty on the evaluation split = (the stitch's accuracy drop when
the cue lies) − (B's own drop).

Budget. 5 seeds (0-4: models, their data draws, IRIs, stitch init order and batch order; the
validation split is drawn once, by seed 0). Every stitch, in every arm: least-squares init, then 200
Adam steps (lr 2e-3, batch 128), scored on the validation split at step 0 and every 20 steps; the
best step is kept (``chosen_step``). Sized from a smoke run of ``stitching_robust.py`` (about 14 ms
per stitch step on 16×16 inputs, one torch thread) to fit 20 minutes on an idle 2-core machine.

Claims and verdict rule. Each comparison is a per-seed difference (within a seed, averaged over the
named layers and objectives), paired by seed, with its 95 % t interval (``simkit.stats``):
"reproduced" when the interval lies on the claimed side of the stated size, "direction only" when
only the mean does, else "not reproduced"; a claim with several comparisons takes the weakest.
- Claim 1 (penalty_min, standard arm, fc1_relu and fc2_relu, every objective scored there): A→S −
  A→A′ and S→A − S→S′ (same front, B differs) are each below +5 points (at most 5 points worse).
- Claim 2 (penalty_min, invariance-aware arm, same layers, SLM, DM and FuLA — IRI-trained HLM uses
  the originals' labels, so it cannot see what B reads): A→S − A→A′ and S→A − S→S′ each above +10
  points; 2b: that gap minus the standard arm's gap above 0 (IRIs separate more than standard).
- Claim 3 (penalty, A→A′, pool2, fc1_relu, fc2_relu, every objective scored): testable only when the
  standard arm's mean exploitation is ≥ 5 points (else "not testable here"); then IRI exploitation −
  standard exploitation below 0.

Expected (the paper): claim 1 reproduced, claim 2 reproduced, claim 3 reproduced (where testable).

    .venv/bin/python examples/stitching_shortcut.py --iri --first-seed 0 --out runs/stitching_shortcut

Writes each pair's run (``<out>/<pair>/report.html``, all seeds), the per-seed table
``examples/results/stitching_shortcut_table.csv`` and the text summary
``examples/results/stitching_shortcut.txt`` (``--results``; the table beside it).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch import nn

import simkit
from simkit.data import Dataset, load_data
from simkit.stats import VERDICTS, Interval, paired_difference, t_interval, verdict

PATCH = 3
LAYERS = ("pool2", "fc1_relu", "fc2_relu")
DEEP = ("fc1_relu", "fc2_relu")
OBJECTIVES = ("hlm", "slm", "dm")  # at every layer; FuLA at every layer but the last
IRI_OBJECTIVES = ("slm", "dm", "fula")
ALL_OBJECTIVES = ("hlm", "slm", "dm", "fula")
ACCURACY_MIN, SHORTCUT_WRONG_MAX, EXPLOITATION_MIN = 0.93, 0.20, 5.0
COPIES = 4  # A and A2 see every training digit with this many random patch positions
MODELS = ("A", "A2", "S", "S2")
PAIRS = (("A", "A2", "eval"), ("A", "S", "eval"), ("S", "A", "eval"), ("S", "S2", "eval"), ("A", "A2", "wrong"))


def edge_corners(side: int = 8, patch: int = PATCH, count: int = 10) -> tuple[tuple[int, int], ...]:
    """``count`` top-left corners of a ``patch``×``patch`` square against the left and right edges of a
    ``side``² image (where digits have the least ink): rows 1, 2, … on the left edge, then rows 0, 1, …
    on the right edge, ``count // 2`` on each (one row apart)."""
    last = side - patch
    half = count // 2
    if half > last or count % 2:
        raise ValueError(f"a {side}² image holds {2 * last} such edge positions, fewer than {count} (or count odd)")
    return tuple([(r, 0) for r in range(last - half + 1, last + 1)] + [(r, last) for r in range(half)])


PATCH_CORNERS = edge_corners()


def plant_patch(x: torch.Tensor, positions: torch.Tensor, value: float = 1.0,
                corners: Sequence[tuple[int, int]] = PATCH_CORNERS, size: int = PATCH) -> torch.Tensor:
    """x (n, c, h, w) → a copy with a ``size``×``size`` square set to ``value`` at ``corners[positions[i]]``."""
    x = x.clone()
    for i, p in enumerate(positions.tolist()):
        r, c = corners[p]
        x[i, :, r:r + size, c:c + size] = value
    return x


class PoolCNN(nn.Module):
    """(b, 1, side, side) → logits (b, 10): two conv + max-pool stages and a two-layer MLP head.

    Pooling and the narrowing head make deeper representations non-injective, so IRIs there can differ
    from their originals in what the model ignores. Stitch points (side 8): ``pool1`` (16×4×4), ``pool2``
    (32×2×2), ``fc1_relu`` (64), ``fc2_relu`` (32).
    """

    def __init__(self, side: int = 8):
        super().__init__()
        self.conv1, self.relu1, self.pool1 = nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        self.conv2, self.relu2, self.pool2 = nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1, self.fc1_relu = nn.Linear(32 * (side // 4) ** 2, 64), nn.ReLU()
        self.fc2, self.fc2_relu = nn.Linear(64, 32), nn.ReLU()
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = self.fc1_relu(self.fc1(self.flatten(x)))
        return self.head(self.fc2_relu(self.fc2(x)))


def train_model(seed: int, data: Dataset, steps: int, name: str, side: int = 8, eps: float = 0.0,
                pgd_steps: int = 5) -> nn.Module:
    """A ``PoolCNN`` initialised by ``seed`` and trained ``steps`` Adam steps on ``data`` (PGD examples
    at ``eps`` when > 0); in eval mode."""
    torch.manual_seed(seed)
    model = PoolCNN(side)
    config = simkit.TrainConfig(steps=steps, lr=3e-3, batch_size=128, seed=seed, weight_decay=1e-2,
                                description=f"train {name}", progress=False)
    if eps > 0:
        simkit.train_adversarial(model, data, config, eps=eps, steps=pgd_steps)
    else:
        simkit.train_classifier(model, data, config)
    return model.eval()


# ----------------------------------------------------------------------------------------- stitching


@dataclass(frozen=True)
class StitchPlan:
    """What every pair's stitching shares: layers, objectives (FuLA at every layer but the last), the
    stitch budget and validation, seeds (``seeds`` of them from ``first_seed``), where runs and the IRI
    cache go, and the arms: the IRI arm beside the standard one (``iri``), its IRIs searched unbounded
    (``iri_radius`` None) or inside a ball of that radius around their seeds (``iri_norm``)."""

    layers: tuple[str, ...]
    seeds: int
    steps: int
    val_every: int
    lr: float
    out: Path
    cache_dir: Path
    first_seed: int = 0
    iri: bool = True
    iri_radius: float | None = None
    iri_norm: str = "linf"

    def settings(self, fula: bool) -> simkit.StitchSettings:
        """The settings of the main call (HLM, SLM, DM at every layer) or the FuLA call (every layer but
        the last)."""
        layers = list(self.layers[:-1] if fula else self.layers)
        return simkit.StitchSettings(layer_a=layers, layer_b=layers, objective=["fula"] if fula else list(OBJECTIVES),
                                     iri=self.iri, iri_radius=self.iri_radius, iri_norm=self.iri_norm, steps=self.steps,
                                     batch_size=128, lr=self.lr, seed=self.first_seed, seeds=self.seeds,
                                     val_every=self.val_every, val_fraction=0.1)


def stitch_pair(plan: StitchPlan, label: str, front: Callable[[int], nn.Module], back: Callable[[int], nn.Module],
                data: Dataset, test_data: Dataset | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Every seed's stitches of one pair (``simkit.stitch`` with ``seeds``; FuLA in a second call at the
    layers where it differs from DM): (stitching rows with a ``pair`` column, IRI rows of the main call
    with their diagnostics (empty without the IRI arm), warnings)."""
    tables, iris, warned = [], pd.DataFrame(), []
    for fula in (False, True):
        if fula and len(plan.layers) < 2:
            continue
        out = plan.out / label.replace(">", "").replace(" ", "_") / ("fula" if fula else "main")
        result = simkit.stitch(front, back, data, plan.settings(fula), test_data=test_data, cache_dir=plan.cache_dir,
                               progress=False, names=(label.split("->")[0], label.split("->")[1]))
        simkit.save_run(result, out)
        tables.append(result.tables["stitching"])
        warned += [f"{label}: {w}" for w in result.summary["warnings"]]
        if not fula and "iris" in result.tables:
            iris = result.tables["iris"].assign(pair=label)
    return pd.concat(tables, ignore_index=True).assign(pair=label), iris, warned


# ------------------------------------------------------------------------------------------ verdicts


@dataclass(frozen=True)
class Comparison:
    """One paired comparison: per-seed ``left − right`` (points), its 95 % t interval, the claimed side
    (``higher``) and size."""

    label: str
    per_seed: pd.Series
    interval: Interval
    higher: bool
    size: float
    unit: str = " pts"

    @property
    def verdict(self) -> str:
        """:func:`simkit.stats.verdict` of the interval against the claimed side and size."""
        return verdict(self.interval, self.higher, self.size)

    def line(self) -> str:
        """``label: per seed [...]; mean (CI); claimed > x: verdict``."""
        bound = (self.size if self.higher else -self.size) + 0.0  # no "-0"
        digits = 1 if self.unit == " pts" else 3
        seeds = ", ".join(f"{v:+.{digits}f}" for v in self.per_seed)
        return (f"  {self.label}: per seed [{seeds}]; {self.interval.text(digits, self.unit)}; claimed "
                f"{'>' if self.higher else '<'} {bound:+g}: {self.verdict}")


def compare(label: str, left: pd.Series, right: pd.Series, higher: bool, size: float, points: bool = True) -> Comparison:
    """The paired (by seed) comparison ``left − right`` of two per-seed series, in points of the
    fractions given (``points``) or in their own units; ``size`` is the claimed distance from 0 on the
    claimed side (negative: a bound on the other side, e.g. ``higher=False, size=-5`` claims the
    difference is below +5)."""
    joined = pd.concat([left.rename("left"), right.rename("right")], axis=1).sort_index() * (100 if points else 1)
    interval = paired_difference(joined.left.to_numpy(float), joined.right.to_numpy(float))
    return Comparison(label, joined.left - joined.right, interval, higher, size, " pts" if points else "")


def per_seed(table: pd.DataFrame, pair: str, setting: str, objectives: Sequence[str], layers: Sequence[str],
             measure: str) -> pd.Series:
    """Within each seed, the mean of ``measure`` over the pair's cells at ``layers`` × ``objectives``
    (those that ran) in ``setting``: a series indexed by seed."""
    part = table[(table.pair == pair) & (table.setting == setting) & table.objective.isin(objectives)
                 & table.layer_a.isin(layers)]
    if part.empty:
        raise ValueError(f"no cells of {pair} {setting} at {layers} with {objectives}")
    return part.groupby("seed")[measure].mean()


@dataclass
class Claim:
    """A claim: its statement, the comparisons that decide it, a reason it cannot be judged (None when
    it can), and comparisons shown beside it that do not decide it (``notes``: a gate, a level)."""

    name: str
    statement: str
    comparisons: list[Comparison]
    blocked: str | None = None
    notes: list[Comparison] = field(default_factory=list)

    def verdict(self) -> str:
        """The weakest verdict of its comparisons (or why it was not judged)."""
        if self.blocked:
            return self.blocked
        return max((c.verdict for c in self.comparisons), key=VERDICTS.index)

    def lines(self) -> list[str]:
        """The claim's statement, verdict and one line per comparison."""
        return [f"{self.name}: {self.statement}", f"  VERDICT: {self.verdict()}", *(c.line() for c in self.comparisons),
                *(f"{c.line()}  (shown, not deciding)" for c in self.notes)]


# ------------------------------------------------------------------------------------------- tables


def interval_cells(table: pd.DataFrame, by: list[str], measure: str, scale: float = 100.0,
                   digits: int = 1) -> pd.Series:
    """``mean [low, high]`` (95 % t interval over seeds, in ``scale`` units, ``digits`` decimals) of
    ``measure`` per ``by``."""
    def cell(values: pd.Series) -> str:
        iv = t_interval(scale * values.to_numpy(float))
        if iv.n < 2 or math.isnan(iv.low):
            return f"{iv.mean:.{digits}f}"
        return f"{iv.mean:.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]"
    return table.groupby(by, sort=False)[measure].apply(cell)


def penalty_tables(table: pd.DataFrame, layers: Sequence[str]) -> list[str]:
    """Both penalties per pair × arm × objective (rows) and layer (columns), mean [95 % CI] in points."""
    lines = []
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_colwidth", 40):
        for measure, what in (("penalty_min", "min(A, B accuracy) − stitched accuracy"),
                              ("penalty", "B's accuracy − stitched accuracy")):
            cells = interval_cells(table, ["pair", "setting", "objective", "layer_a"], measure)
            lines += ["", f"{measure} (points, {what}, on the evaluation data), mean [95 % t interval] over seeds:",
                      cells.unstack("layer_a").reindex(columns=list(layers)).fillna("-").to_string()]
    return lines


IRI_DIAGNOSTICS = ("iri_converged_fraction", "seed_linf_median", "seed_l2_median", "b_target_class_fraction",
                   "b_seed_class_fraction")
BOUNDED_DIAGNOSTICS = ("reached_inside_radius_fraction", "distance_median")  # a bounded search's, in its norm


def iri_table(iris: pd.DataFrame, layers: Sequence[str]) -> list[str]:
    """The IRI diagnostics per pair and layer, mean [95 % CI] over seeds (fractions and input units); a
    bounded search adds the fraction that reached the tolerance inside the ball and the median distance
    from the seed in the ball's norm (the last two columns)."""
    names = [*IRI_DIAGNOSTICS, *(name for name in BOUNDED_DIAGNOSTICS if name in iris.columns)]
    rows = {name: interval_cells(iris, ["pair", "layer_a"], name, scale=1.0, digits=2) for name in names}
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_colwidth", 30):
        frame = pd.DataFrame(rows)
        frame = frame.reindex(sorted(frame.index, key=lambda k: (k[0], list(layers).index(k[1]))))
    return ["", "IRI diagnostics per pair and layer, mean [95 % t interval] over seeds: converged fraction "
            "(relative error ≤ 0.05), median L∞ and L2 distance from the seed input (input units, data range "
            "[0, 1]), fraction of IRIs B labels as the input they represent (target) and as their seed's class:",
            frame.to_string()]


# ----------------------------------------------------------------------------------------- provenance


def provenance() -> str:
    """``commit <short hash>`` with an ``(uncommitted: …)`` note listing the changed paths when dirty."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line.strip()]
    if not changed:
        return f"commit {head}"
    shown = ", ".join(changed[:15]) + (f", … ({len(changed)} paths)" if len(changed) > 15 else "")
    return f"commit {head} (uncommitted: {shown})"


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo and the core count."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} cores"


@dataclass
class RunClock:
    """Run time and load averages before and after, for the results file."""

    started: float = field(default_factory=time.perf_counter)
    load_before: tuple[float, float, float] = field(default_factory=os.getloadavg)

    def lines(self) -> list[str]:
        """The provenance lines: commit, CPU, load before/after, run time."""
        after = os.getloadavg()
        return [f"Code: {provenance()}", f"CPU: {cpu_model()}; torch threads {torch.get_num_threads()}",
                "Load average (1, 5, 15 min) before: " + ", ".join(f"{v:.2f}" for v in self.load_before)
                + "; after: " + ", ".join(f"{v:.2f}" for v in after),
                f"Run time: {time.perf_counter() - self.started:.0f} s"]


# ------------------------------------------------------------------------------------------- the run


def datasets(seed: int) -> dict[str, Dataset]:
    """The data of seed ``seed``'s models (``A``, ``A2``, ``S``, ``S2``: their own draws) and the shared
    ``stitch`` (training split, patch at label; its test split the evaluation data), ``evaluation`` and
    ``wrong`` (test split, patch at label + 1)."""
    clean = load_data("digits")
    train_part, test = clean.train_test()
    x, y, info = train_part.inputs, train_part.labels, clean.info
    g = torch.Generator().manual_seed(1000 + seed)
    evaluation = Dataset(plant_patch(test.inputs, test.labels), test.labels, "digits test, patch at label", info=info)
    out = {"stitch": Dataset(plant_patch(x, y), y, "digits, patch at label", test=evaluation, info=info),
           "evaluation": evaluation, "plain": test,
           "wrong": Dataset(plant_patch(test.inputs, (test.labels + 1) % 10), test.labels, "digits test, wrong patch",
                            info=info)}
    for name in ("A", "A2"):  # COPIES copies of every image, each with its own random patch position
        xs, ys = x.repeat(COPIES, 1, 1, 1), y.repeat(COPIES)
        out[name] = Dataset(plant_patch(xs, torch.randint(0, 10, (len(xs),), generator=g)), ys,
                            "digits, random patch", info=info)
    for name in ("S", "S2"):
        out[name] = Dataset(plant_patch(x[torch.randperm(len(x), generator=g)], y), y, "random digit, patch at label",
                            info=info)
    return out


def check_models(models: dict[tuple[str, int], nn.Module], data: dict[str, Dataset]) -> tuple[list[str], set[str]]:
    """Every model's accuracy on the evaluation, wrong-patch and plain splits: (lines, the names of
    models failing a precondition)."""
    lines, failed = [], set()
    for (name, seed), model in models.items():
        accs = {split: simkit.evaluate_accuracy(model, data[split].inputs, data[split].labels)
                for split in ("evaluation", "wrong", "plain")}
        problems = [f"evaluation {accs['evaluation']:.3f} < {ACCURACY_MIN}"] if accs["evaluation"] < ACCURACY_MIN else []
        if name.startswith("S") and accs["wrong"] > SHORTCUT_WRONG_MAX:
            problems.append(f"wrong-patch {accs['wrong']:.3f} > {SHORTCUT_WRONG_MAX} (does not follow the patch)")
        failed |= {name.rstrip("2")} if problems else set()
        lines.append(f"  seed {seed} {name}: evaluation {accs['evaluation']:.3f}, wrong patch {accs['wrong']:.3f}, "
                     f"plain digits {accs['plain']:.3f}" + (f"  FAILED: {'; '.join(problems)}" if problems else "  ok"))
    return lines, failed


def claims(table: pd.DataFrame, failed: set[str], layers: Sequence[str]) -> list[Claim]:
    """Claims 1, 2, 2b and 3 of the docstring from the stitching rows of every pair and seed."""
    def gap(setting: str, objectives: Sequence[str], ref: str, pair: str) -> pd.Series:
        measure = per_seed(table, pair, setting, objectives, DEEP, "penalty_min")
        return measure - per_seed(table, ref, setting, objectives, DEEP, "penalty_min")
    blocked = "precondition failed (see the model checks)" if failed else None
    refs = SAME_KIND_REFS
    one = Claim("Claim 1", "standard stitching rates clean<->shortcut about as compatible as same-kind pairs "
                "(penalty_min, standard arm, fc1_relu + fc2_relu, all objectives scored there; at most 5 points worse)",
                [compare(f"{p} − {r}", per_seed(table, p, "standard", ALL_OBJECTIVES, DEEP, "penalty_min"),
                         per_seed(table, r, "standard", ALL_OBJECTIVES, DEEP, "penalty_min"), False, -5.0)
                 for r, p in refs], blocked)
    two = Claim("Claim 2", "invariance-aware stitching scores clean<->shortcut >= 10 points worse than the "
                "same-kind pair with the same front (penalty_min, IRI arm, fc1_relu + fc2_relu, SLM/DM/FuLA)",
                [compare(f"{p} − {r}", per_seed(table, p, "iri", IRI_OBJECTIVES, DEEP, "penalty_min"),
                         per_seed(table, r, "iri", IRI_OBJECTIVES, DEEP, "penalty_min"), True, 10.0)
                 for r, p in refs], blocked)
    two_b = Claim("Claim 2b", "the IRI arm separates clean<->shortcut from the same-kind pair more than the "
                  "standard arm does (gap IRI − gap standard > 0; penalty_min, SLM/DM/FuLA, fc1_relu + fc2_relu)",
                  [compare(f"({p} − {r}) iri − standard", gap("iri", IRI_OBJECTIVES, r, p),
                           gap("standard", IRI_OBJECTIVES, r, p), True, 0.0) for r, p in refs], blocked)
    return [one, two, two_b, claim_three(table, failed, layers)]


OBJECTIVE_NAMES = {"hlm": "HLM", "slm": "SLM", "dm": "DM", "fula": "FuLA"}
S1_OBJECTIVES = ("hlm", "slm")  # the confirmatory run's deciding objectives; DM and FuLA are reported separately
SAME_KIND_REFS = (("A->A2", "A->S"), ("S->S2", "S->A"))  # (same-kind pair, clean<->shortcut pair with its front)


def claims_by_objective(table: pd.DataFrame, failed: set[str]) -> list[Claim]:
    """Claim S1 of the confirmatory run, one objective at a time (penalty_min, standard arm, fc1_relu +
    fc2_relu; A→S − A→A′ and S→A − S→S′ each below +5 points): S1 (HLM) and S1 (SLM) decide, S1 overall
    is the weaker of the two; DM and FuLA follow with the same comparisons, reported separately."""
    blocked = "precondition failed (see the model checks)" if failed else None

    def one(objective: str, name: str) -> Claim:
        shown = OBJECTIVE_NAMES[objective]
        return Claim(name, f"standard stitching with {shown} rates clean<->shortcut at most 5 points worse "
                     "than the same-kind pair with the same front (penalty_min, fc1_relu + fc2_relu)",
                     [compare(f"{shown} {p} − {r}", per_seed(table, p, "standard", (objective,), DEEP, "penalty_min"),
                              per_seed(table, r, "standard", (objective,), DEEP, "penalty_min"), False, -5.0)
                      for r, p in SAME_KIND_REFS], blocked)
    decided = [one(objective, f"S1 ({OBJECTIVE_NAMES[objective]})") for objective in S1_OBJECTIVES]
    overall = Claim("S1 overall", "the weaker of S1 (HLM) and S1 (SLM)",
                    [c for claim in decided for c in claim.comparisons], blocked)
    separate = [one(objective, f"{OBJECTIVE_NAMES[objective]} (reported separately, decides nothing)")
                for objective in ALL_OBJECTIVES if objective not in S1_OBJECTIVES]
    return [*decided, overall, *separate]


def claim_three(table: pd.DataFrame, failed: set[str], layers: Sequence[str]) -> Claim:
    """Claim 3: exploitation of the planted cue by A→A′ (penalty on the wrong-patch split − on the
    evaluation split), IRI − standard, over every scored cell; gated on standard exploitation ≥ 5."""
    def exploitation(setting: str) -> pd.Series:
        return (per_seed(table, "A->A2 (wrong patch)", setting, ALL_OBJECTIVES, layers, "penalty")
                - per_seed(table, "A->A2", setting, ALL_OBJECTIVES, layers, "penalty"))
    standard, iri = exploitation("standard"), exploitation("iri")
    zero = pd.Series(0.0, index=standard.index)
    gate = compare("standard exploitation (gate: mean >= 5)", standard, zero, True, EXPLOITATION_MIN)
    shown = compare("IRI exploitation", iri, zero, True, 0.0)
    blocked = "precondition failed (see the model checks)" if "A" in failed else None
    if blocked is None and gate.interval.mean < EXPLOITATION_MIN:
        blocked = f"not testable here (standard exploitation {gate.interval.mean:.1f} < {EXPLOITATION_MIN:g} points)"
    return Claim("Claim 3", "invariance-aware stitching exploits the cue absent from A and A′'s training less than "
                 "standard stitching (exploitation = penalty on the wrong-patch split − penalty on the evaluation "
                 "split, A->A2, all scored cells; IRI − standard < 0)",
                 [compare("IRI − standard exploitation", iri, standard, False, 0.0)], blocked, [gate, shown])


def exploitation_cells(table: pd.DataFrame, layers: Sequence[str]) -> list[str]:
    """Exploitation (points) per arm × objective × layer, mean [95 % CI] over seeds."""
    keys = ["seed", "setting", "objective", "layer_a"]
    wrong = table[table.pair == "A->A2 (wrong patch)"].set_index(keys).penalty
    right = table[table.pair == "A->A2"].set_index(keys).penalty
    frame = (wrong - right).rename("exploitation").reset_index()
    cells = interval_cells(frame, ["setting", "objective", "layer_a"], "exploitation")
    with pd.option_context("display.width", 250, "display.max_colwidth", 40):
        return ["", "Exploitation of the planted cue by A->A2 (points: penalty on the wrong-patch split − on the "
                "evaluation split), mean [95 % t interval] over seeds:",
                cells.unstack("layer_a").reindex(columns=list(layers)).fillna("-").to_string()]


def parse_args(name: str = "stitching_shortcut", seeds: int = 5, description: str | None = None,
               first_seed: int = 0) -> argparse.Namespace:
    """The stitching experiments' command line, parsed (:func:`argument_parser`)."""
    return argument_parser(name, seeds, description, first_seed).parse_args()


def argument_parser(name: str = "stitching_shortcut", seeds: int = 5, description: str | None = None,
                    first_seed: int = 0) -> argparse.ArgumentParser:
    """The stitching experiments' command line: ``--out runs/NAME``, ``--results examples/results/NAME.txt``,
    seeds (``--seeds`` of them from ``--first-seed``), training and stitching budgets, threads."""
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(f"runs/{name}"))
    parser.add_argument("--results", type=Path, default=Path(f"examples/results/{name}.txt"))
    parser.add_argument("--seeds", type=int, default=seeds)
    parser.add_argument("--first-seed", type=int, default=first_seed, help="the first of the seeds (models, data "
                        "draws, stitches, validation split)")
    parser.add_argument("--train-steps", type=int, default=800)
    parser.add_argument("--stitch-steps", type=int, default=200)
    parser.add_argument("--val-every", type=int, default=20)
    parser.add_argument("--stitch-lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: no oversubscription on a "
                        "shared machine)")
    return parser


def train_all(seeds: int, steps: int, first_seed: int = 0) -> dict[tuple[str, int], nn.Module]:
    """A, A′, S, S′ of every seed (``seeds`` from ``first_seed``), each on its own data draw (init seed
    ``100·seed + k``)."""
    models = {}
    for seed in range(first_seed, first_seed + seeds):
        data = datasets(seed)
        for k, name in enumerate(MODELS):
            models[(name, seed)] = train_model(100 * seed + k, data[name], steps, f"{name} seed {seed}")
    return models


def write(lines: list[str], table: pd.DataFrame, results: Path) -> None:
    """The text summary to ``results`` (and stdout) and the per-seed rows beside it (``_table.csv``)."""
    text = "\n".join(lines)
    print(text)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(text + "\n", encoding="utf-8")
    table.to_csv(results.with_name(results.stem + "_table.csv"), index=False, float_format="%.6g")


def stitch_pairs(plan: StitchPlan, pairs: Sequence[tuple[str, str, str]], models: dict[tuple[str, int], nn.Module],
                 data: dict[str, Dataset], clock: RunClock) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Every pair of ``pairs`` (front, back, ``eval`` or ``wrong`` split) stitched with ``plan``: (the
    stitching rows of all, their IRI rows, warnings)."""
    frames, iri_frames, warned = [], [], []
    for front, back, split in pairs:
        label = f"{front}->{back}" + (" (wrong patch)" if split == "wrong" else "")
        rows, iris, w = stitch_pair(plan, label, lambda s, m=front: models[(m, s)], lambda s, m=back: models[(m, s)],
                                    data["stitch"], data["wrong"] if split == "wrong" else None)
        frames.append(rows)
        iri_frames.append(iris)
        warned += w
        print(f"{label}: done at {time.perf_counter() - clock.started:.0f} s", flush=True)
    return pd.concat(frames, ignore_index=True), pd.concat(iri_frames, ignore_index=True), warned


def main() -> None:
    parser = argument_parser(first_seed=5)
    parser.add_argument("--iri", action="store_true", help="the full design: add the IRI arm, the wrong-patch "
                        "pair and claims 1-3 (default: the S1 confirmatory run, standard arm only)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = RunClock()
    data = datasets(0)
    models = train_all(args.seeds, args.train_steps, args.first_seed)
    checks, failed = check_models(models, data)
    seeds = f"seeds {args.first_seed}-{args.first_seed + args.seeds - 1}"
    run = ("the full design (both arms, claims 1-3)" if args.iri else
           "S1 confirmatory (issue #39, experiment 3): the standard arm only")
    lines = [__doc__.splitlines()[0], "", f"Run: {run}, {seeds}.", "",
             "Model checks (accuracy; preconditions: evaluation >= 0.93 for every "
             "model, wrong patch <= 0.20 for S, S2):", *checks,
             f"Preconditions: {'FAILED for ' + ', '.join(sorted(failed)) if failed else 'all met'}", ""]
    print("\n".join(lines), flush=True)
    plan = StitchPlan(LAYERS, args.seeds, args.stitch_steps, args.val_every, args.stitch_lr, args.out,
                      args.out / ".iri-cache", first_seed=args.first_seed, iri=args.iri)
    pairs = PAIRS if args.iri else [p for p in PAIRS if p[2] == "eval"]
    table, iris, warned = stitch_pairs(plan, pairs, models, data, clock)
    lines += [f"Stitch budget: {args.stitch_steps} Adam steps (lr {args.stitch_lr:g}) per stitch, validation every "
              f"{args.val_every} steps "
              f"(chosen step: mean {table.chosen_step.mean():.0f}, range {table.chosen_step.min()}-"
              f"{table.chosen_step.max()}); {seeds}; layers {', '.join(LAYERS)}."]
    lines += ["", "VERDICTS (per-seed differences in points, paired by seed, 95 % t interval):"]
    for claim in claims(table, failed, LAYERS) if args.iri else claims_by_objective(table, failed):
        lines += claim.lines()
    lines += penalty_tables(table[table.pair != "A->A2 (wrong patch)"], LAYERS)
    if args.iri:
        lines += exploitation_cells(table, LAYERS) + iri_table(iris, LAYERS)
    lines += ["", "Warnings:", *(warned or ["none"]), "", *clock.lines()]
    write(lines, table, args.results)


if __name__ == "__main__":
    main()
