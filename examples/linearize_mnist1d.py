"""Channel-wise vs layer-wise post-training linearization on MNIST-1D ("ResNets are deeper than you think").

A plain CNN (conv → BN → ReLU blocks) and a residual CNN of the same size are trained on MNIST-1D, then
every ReLU is swapped for a learnable slope α (starting at 0: the same network) and post-trained with
cross-entropy + ω·Σ(|1 − α| + ε)^0.5 over an ω sweep, once with one α per channel (units can become
linear one by one: variable depth) and once with one α per layer (a layer is linear or not: fixed depth).

The table printed at the end compares the two at matched NAPL (normalised average path length): the
channel-wise accuracy interpolated at each layer-wise run's NAPL, minus the layer-wise accuracy. The paper's
claim: at low NAPL channel-wise keeps more accuracy, and starting from a residual network the gap shrinks.

    .venv/bin/python examples/linearize_mnist1d.py --out runs/linearize_mnist1d
    .venv/bin/python examples/linearize_mnist1d.py --quick          # a one-minute smoke run

Each network's run directory (with report.html) is written under --out; rerunning with the same settings
resumes finished runs (other settings are refused: choose another --out).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import simkit
from simkit.data import load_data
from simkit.models import load_model

NETWORKS = {
    "plain": "simkit:cnn1d:channels=16,layers=4",
    "residual": "simkit:cnn1d:channels=16,layers=4,residual=True",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/linearize_mnist1d"))
    parser.add_argument("--train-epochs", type=float, default=15)
    parser.add_argument("--epochs", type=float, default=4, help="post-training epochs per run")
    parser.add_argument("--omegas", default="1e-3,1e-2,3e-2,1e-1,1")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--slope-lr", type=float, default=3e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args()
    omegas = [float(w) for w in args.omegas.split(",")]
    n = None
    if args.quick:
        args.train_epochs, args.epochs, omegas, n = 3, 2, [1e-2, 1e-1], 1000

    data = load_data("mnist1d", n=n, seed=args.seed)
    settings = simkit.LinearizeSettings(omega=omegas, epochs=args.epochs, train=args.train_epochs, lr=args.lr,
                                        slope_lr=args.slope_lr, batch_size=128, seed=args.seed)
    tables, summaries = [], {}
    for name, spec in NETWORKS.items():
        started = time.perf_counter()
        model = load_model(spec, seed=args.seed)
        run_dir = args.out / name
        # an earlier run of the same settings resumes (finished runs are skipped); other settings are refused
        result = simkit.linearize(model, data, settings, run_dir=run_dir, resume=(run_dir / "inputs.json").is_file(),
                                  progress=False, model_name=spec)
        simkit.save_run(result, run_dir)
        runs = result.tables["runs"].assign(network=name)
        tables.append(runs)
        summaries[name] = (result.summary, result.tables["matched"], time.perf_counter() - started)

    pd.set_option("display.width", 160)
    columns = ["network", "granularity", "omega", "napl", "apl", "nonlinear_fraction", "accuracy", "time_s"]
    print("\nAll runs (accuracy on the MNIST-1D test split):")
    print(pd.concat(tables)[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for name, (summary, matched, seconds) in summaries.items():
        print(f"\n{name}: original accuracy {summary['original_accuracy']:.4f}, original NAPL "
              f"{summary['original_napl']:.3g} ({seconds:.0f} s)")
        print("channel − layer accuracy at matched NAPL:")
        print(matched.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        low = matched[matched["napl"] <= matched["napl"].median()] if len(matched) else matched
        if len(low):
            print(f"mean difference over the lower-NAPL half: {low['difference'].mean():+.4f}")
    print(f"\nreports: {args.out}/plain/report.html, {args.out}/residual/report.html")


if __name__ == "__main__":
    main()
