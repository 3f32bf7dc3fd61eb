"""Bottom-up convergence during training (SVCCA, Raghu et al. 2017, Fig. 4), with ``simkit.Monitor`` in a
plain PyTorch loop.

Design (written before the first full run; issue #42):
- Claim (the paper's): lower layers converge to their final representation earlier than higher layers.
- Network and data: the built-in 1-D CNN with 5 conv blocks (``simkit:cnn1d:layers=5``, BatchNorm, 32
  channels) on MNIST-1D (4,000 training samples, generated locally), Adam lr 1e-3, batch 128, 15 epochs
  (480 steps), one budget for every seed. Layers: ``blocks.0`` … ``blocks.4`` and the linear ``head``.
- Measurement: the monitor compares each layer, every 16 steps, with the same layer at the final step
  (reference ``final``: the probe's activations are kept and compared at the end, as SVCCA does), by
  unbiased CKA (minibatch, 128 per batch) on a fixed probe of 512 samples held out of training (the last
  512 of the training split; the test split is not used to choose anything and only gives the accuracy).
  A layer's *stabilisation step* is the first measured step from which its similarity to its final
  representation stays ≥ 0.95 (δ = 0.05 of the final value 1).
- Gate: every seed's network learns (test accuracy ≥ 50 %, chance 10 %); a seed that fails is reported.
- Verdicts (5 seeds, paired by seed, 95 % Student t intervals from ``simkit.stats``):
  1. ``head`` − ``blocks.0`` stabilisation step > 0 (the last layer after the first): reproduced when the
     interval lies above 0, direction only when only the mean does.
  2. Spearman's ρ(depth, stabilisation step) over the six layers > 0, its mean over seeds with its interval.
Run: ``python examples/svcca_convergence.py`` (about 2 minutes on 2 cores); writes
``examples/results/svcca_convergence.md`` (per-seed values, intervals, verdicts, commit, CPU, load).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats as scistats
from torch import nn

import simkit
from simkit.data import load_data
from simkit.models import load_model
from simkit.stats import paired_difference, t_interval, verdict

LAYERS = ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "head"]
PROBE = 512


def train_one(seed: int, epochs: int, every: int, out: Path) -> dict:
    """Train one seed with the monitor attached; its stabilisation steps, ρ and test accuracy."""
    torch.manual_seed(seed)
    data = load_data("mnist1d")
    x, y = data.inputs[:-PROBE], data.labels[:-PROBE]
    probe = data.inputs[-PROBE:]
    model = load_model("simkit:cnn1d:layers=5", seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    monitor = simkit.Monitor(model, probe, layers=LAYERS, reference="final", every=every, n=PROBE,
                             metrics=["unbiased_cka"], run_dir=out / f"seed{seed}", trackers=None,
                             report=seed == 0, data_name="mnist1d (last 512 training samples)")
    generator = torch.Generator().manual_seed(seed)
    step = 0
    monitor.step(step)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 128):
            batch = order[start:start + 128]
            model.train()
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            monitor.step(step)
    monitor.measure(step)  # the final step itself, whatever `every` is
    result = monitor.close()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(data.test.inputs).argmax(1) == data.test.labels).float().mean())
    table = result.tables["convergence"]
    same = table[table["layer"] == table["reference_layer"]].set_index("layer")
    steps = [float(same.loc[layer, "stable_step"]) for layer in LAYERS]
    rho = scistats.spearmanr(np.arange(len(LAYERS)), steps).statistic
    return {"seed": seed, "accuracy": accuracy, "steps": steps, "rho": float(rho), "final_step": step}


def current_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def machine_line(commit: str, started: float) -> str:
    """The commit at the start of the run, the CPU, and the load and time at its end."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (f"commit {commit} (at the start of the run), CPU {cpu}, {os.cpu_count()} cores, load average at the "
            f"end {os.getloadavg()[0]:.1f}, {time.time() - started:.0f} s")


def write_note(runs: list[dict], path: Path, machine: str) -> str:
    gap = paired_difference([r["steps"][-1] for r in runs], [r["steps"][0] for r in runs])
    rho = t_interval([r["rho"] for r in runs])
    lines = ["# Bottom-up convergence (SVCCA) with simkit.Monitor", "", machine, "",
             "| seed | test accuracy | " + " | ".join(LAYERS) + " | ρ(depth, step) |",
             "|---|---|" + "---|" * len(LAYERS) + "---|"]
    for r in runs:
        lines.append(f"| {r['seed']} | {r['accuracy']:.3f} | " + " | ".join(f"{s:.0f}" for s in r["steps"])
                     + f" | {r['rho']:.2f} |")
    gate = all(r["accuracy"] >= 0.5 for r in runs)
    lines += ["", f"Gate (every seed ≥ 50 % test accuracy): {'passed' if gate else 'FAILED'}.", "",
              "| claim | paper | ours (mean, 95 % t interval over seeds) | verdict |", "|---|---|---|---|"]
    for name, found, digits in (("head − blocks.0 stabilisation step > 0", gap, 0),
                                ("ρ(depth, stabilisation step) > 0", rho, 2)):
        lines.append(f"| {name} | lower layers converge first | {found.text(digits=digits)} | "
                     f"{verdict(found) if gate else 'not testable (gate failed)'} |")
    lines += immediate_layers(runs)
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


def immediate_layers(runs: list[dict]) -> list[str]:
    """A caution for layers already within δ of their final representation at the first measurement (step
    0, the untrained network) in every seed, with the claim-1 difference from the first layer that was not
    (added after the first full run showed blocks.0 at step 0 in every seed: reported, not a verdict)."""
    first = [i for i, _ in enumerate(LAYERS) if all(r["steps"][i] == 0 for r in runs)]
    if not first:
        return []
    later = next((i for i in range(len(LAYERS)) if i not in first), None)
    names = ", ".join(LAYERS[i] for i in first)
    out = ["", f"Read with care: {names} stayed within δ of its final representation from step 0 (the untrained "
           "network) in every seed, so its stabilisation is immediate rather than early; claim 1 measures that."]
    if later is not None and later < len(LAYERS) - 1:
        gap = paired_difference([r["steps"][-1] for r in runs], [r["steps"][later] for r in runs])
        out.append(f"Reported beside it (chosen after the first run, not a verdict): head − {LAYERS[later]} "
                   f"stabilisation step {gap.text(digits=0)}.")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--every", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("runs/svcca_convergence"))
    parser.add_argument("--results", type=Path, default=Path("examples/results/svcca_convergence.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    started, commit = time.time(), current_commit()
    runs = [train_one(seed, args.epochs, args.every, args.out) for seed in range(args.seeds)]
    print(write_note(runs, args.results, machine_line(commit, started)))


if __name__ == "__main__":
    main()
