# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A study of many models
#
# Which of several networks represent the data alike? Capture each model's activations once into a cache,
# then compare all of them in one pass: `simkit.study` gives the model × model matrix per measure, a map of
# the models (classical multidimensional scaling) and a clustering tree, each value with its chance level.
# Here: three small CNNs trained from different seeds, one CNN left at its random initialisation, and two
# MLPs, all on scikit-learn's 8×8 digits.

# %%
import tempfile
from pathlib import Path

import simkit
from simkit.data import load_data
from simkit.models import load_model

data = load_data("digits")
config = simkit.TrainConfig(epochs=6, lr=3e-3, progress=False)
specs = {
    "cnn-s0": ("simkit:cnn2d", 0, True),
    "cnn-s1": ("simkit:cnn2d", 1, True),
    "cnn-s2": ("simkit:cnn2d", 2, True),
    "cnn-untrained": ("simkit:cnn2d", 3, False),
    "mlp-s0": ("simkit:mlp:in_features=64,hidden=64,depth=2", 0, True),
    "mlp-s1": ("simkit:mlp:in_features=64,hidden=64,depth=2", 1, True),
}
caches = Path(tempfile.mkdtemp())
for name, (spec, seed, train) in specs.items():
    model = load_model(spec, seed=seed)
    if train:
        simkit.train_classifier(model, data, config.updated(seed=seed))
    accuracy = simkit.evaluate_accuracy(model, data.test.inputs, data.test.labels)
    # every model reads the same 360 test images; `mean` averages a CNN's maps over space
    simkit.capture(model, data.test, caches / name, layers="blocks", reduce="mean", model_name=name,
                   progress=False)
    print(f"{name:14s} test accuracy {accuracy:.3f}")

# %% [markdown]
# A cache is a folder of safetensors shards and a `manifest.json` that records the model, its weights, the
# data and a digest of the samples: caches of different samples are refused. `pairing` chooses one layer
# per model: `last` (the default), `first`, `depth:F` (the layer at relative depth F, for architectures of
# different depth), or layer names.

# %%
result = simkit.study([caches / name for name in specs], metrics=["unbiased_cka", "procrustes"],
                      pairing="last", names=list(specs), progress=False)
result.matrix("unbiased_cka").round(2)

# %% [markdown]
# The report opens with the most similar pair of *different* models that beats its chance level and the
# mean between different models, then draws the map and the tree for the lead measure:

# %%
result

# %% [markdown]
# The map's coordinates and the tree's merges are tables too. `share` is the part of the dissimilarities'
# eigenvalue mass that the map's two axes hold (near 1: the map's distances are the table's);
# `cophenetic` is how well the tree's heights keep the dissimilarities.

# %%
result.tables["embedding"].query("metric == 'unbiased_cka'").round(3)

# %%
result.tables["linkage"].query("metric == 'unbiased_cka'")[
    ["step", "left_label", "right_label", "distance", "cophenetic"]].round(3)

# %% [markdown]
# What this says: the trained CNNs sit together, the MLPs form a group of their own, and the untrained CNN
# stands apart; every value in the matrix comes with its chance level in `result.to_frame()`.
#
# The same study from the command line:
#
#     for s in 0 1 2; do simkit capture simkit:cnn2d --data digits --seed $s --reduce mean --out runs/cnn-s$s; done
#     simkit compare runs/cnn-s* --names s0,s1,s2 --out runs/study
#
# Caches also let one model be compared with many others without running it again
# ([Scaling up](../scaling.md)).
