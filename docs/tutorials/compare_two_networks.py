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
# # Compare two networks and read the report
#
# Two small CNNs of the same architecture, trained from different seeds on scikit-learn's 8×8 digits:
# how similar are their layers inside? This page is a notebook executed when the site is built (on the
# CPU, in a few seconds); its source is `docs/tutorials/compare_two_networks.py`, a jupytext script you
# can run as it is or open as a notebook.
#
# ## The two networks
#
# `simkit.models.load_model` builds models from spec strings (the same specs as the command line);
# `simkit:cnn2d` is the built-in CNN for 8×8 images. `simkit.train_classifier` trains through simkit's one
# training loop.

# %%
import tempfile
from pathlib import Path

import simkit
from simkit.data import load_data
from simkit.models import load_model

data = load_data("digits")  # 1437 training images (n, 1, 8, 8), 360 more in data.test
config = simkit.TrainConfig(epochs=8, lr=3e-3, progress=False)
models = {}
for seed in (0, 1):
    model = load_model("simkit:cnn2d", seed=seed)
    simkit.train_classifier(model, data, config.updated(seed=seed))
    accuracy = simkit.evaluate_accuracy(model, data.test.inputs, data.test.labels)
    print(f"seed {seed}: test accuracy {accuracy:.3f}")
    models[seed] = model

# %% [markdown]
# ## The comparison
#
# `simkit.compare` runs both models over the data once and measures every chosen layer of A against every
# chosen layer of B. The default layers are the `blocks` preset (residual blocks, transformer layers, else
# the top-level children); the default measures are `unbiased_cka` (minibatch CKA with unbiased HSIC, the
# one the report leads with) and `linear_cka`, each with its chance level (a 10-permutation null of the
# per-batch Grams, about 1 % extra work). We compare on the held-out test images.

# %%
result = simkit.compare(models[0], models[1], data.test, names=("cnn seed 0", "cnn seed 1"), progress=False)
result.summary["metrics"], result.summary["n"], result.summary["mode"]

# %% [markdown]
# ## Reading the report
#
# In a notebook a result shows the report's findings, its cautions and its heatmaps inline. Read them in
# that order:
#
# 1. **Findings**: the lead measure averaged over all layer pairs, where it peaks, its mean at matching
#    relative depth against elsewhere, and per measure how many pairs *beat chance* (lie beyond their
#    null's 95th percentile) and how many of those by a *large* margin (at least 20 % of the range).
# 2. **Read with care**: what to distrust. Here the biased `linear_cka` in minibatch mode: its value is
#    inflated by the batch size, which is why `unbiased_cka` leads.
# 3. **Heatmaps**: rows are A's layers, columns B's; a dotted cell does not beat chance.
#
# (The report names each model's weights as `load_model` made them, "random init, seed 0": it does not
# know that the notebook trained them afterwards. Save trained weights with `simkit.models.save_model` and
# load that file (`load_model("file:PATH")`), and the report names that file.)

# %%
result

# %% [markdown]
# The numbers behind it are tidy tables. `result.matrix(metric)` is the layer × layer matrix;
# `result.to_frame()` the long table (`similarity.csv` in a run directory) with each value's chance level
# and whether it beats it.

# %%
result.matrix("unbiased_cka").round(3)

# %%
frame = result.to_frame()
frame[frame.metric == "unbiased_cka"][["layer_a", "layer_b", "value", "chance", "beats_chance"]].round(3)

# %% [markdown]
# What this says: two networks trained from different seeds end up with similar representations at the
# same depth (the diagonal), and the similarity falls as the layers grow apart. A value alone says
# little; its chance level says whether it is more than what two unrelated layers would give on these
# samples (see [Chance levels and intervals](chance_levels.py)).
#
# ## A figure for a paper, and the run directory
#
# `result.plot(metric)` draws a heatmap (extra `[notebook]`, seaborn); `result.savefig(folder)` writes
# every figure of the report as PNG, PDF and SVG. `simkit.save_run` writes the run directory the command
# line writes: `similarity.csv`, `layers.csv`, `result.json` and the self-contained `report.html`.

# %%
result.plot("unbiased_cka")

# %%
out = Path(tempfile.mkdtemp()) / "cnn-seeds"
simkit.save_run(result, out)
sorted(p.name for p in out.iterdir())

# %% [markdown]
# `simkit.load(out)` reads it back. The same comparison from the command line, with models from specs
# (random initialisation here, as no weights are given):
#
#     simkit compare simkit:cnn2d simkit:cnn2d --data digits --out runs/cnn-seeds
#
# Next: [bring your own activations](your_own_activations.py), or [choose a measure](../measures.md).
