"""Regenerate docs/assets/heatmap.svg, the figure of the README and the site's home page.

Two 6-block CNNs (`simkit:cnn2d:layers=6`) trained from seeds 0 and 1 on scikit-learn's digits, compared
on the 360 test images by unbiased CKA (minibatch, its 10-permutation null), drawn by simkit's own figure
code (`result.savefig`). About 30 s on one CPU core:

    .venv/bin/python docs/assets/make_heatmap.py
"""

from __future__ import annotations

from pathlib import Path

import simkit
from simkit.data import load_data
from simkit.models import load_model

LAYERS = [f"blocks.{i}" for i in range(6)] + ["head"]


def main() -> None:
    data = load_data("digits")
    models = []
    for seed in (0, 1):
        model = load_model("simkit:cnn2d:layers=6", seed=seed)
        simkit.train_classifier(model, data, simkit.TrainConfig(epochs=8, lr=3e-3, seed=seed, progress=False))
        models.append(model)
    result = simkit.compare(models[0], models[1], data.test, layers_a=LAYERS, layers_b=LAYERS,
                            metrics=["unbiased_cka"], names=("CNN, seed 0", "CNN, seed 1"), progress=False)
    result.savefig(Path(__file__).with_name("heatmap.svg"), name="unbiased_cka")


if __name__ == "__main__":
    main()
