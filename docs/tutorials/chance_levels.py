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
# # Chance levels, intervals and corrected p-values
#
# A similarity value alone does not say whether two layers share anything. Biased CKA between two
# *unrelated* wide layers on few samples is far above 0; RSA and k-NN measures have their own floors. simkit
# gives every value its **chance level** (what the measure gives when B's samples are shuffled), and on
# request a **confidence interval** and a **p-value** corrected across the layer grid. This page shows each on
# activations whose truth we know: two layers that share a signal, and two that share nothing.

# %%
import numpy as np
import pandas as pd

import simkit
from simkit.catalog import beats_chance_rule

rng = np.random.default_rng(0)
n = 120
shared = rng.normal(size=(n, 5))                       # a 5-dimensional signal both models carry


def layer(signal_weight: float, width: int) -> np.ndarray:
    """``n`` samples of a layer: the shared signal mixed into ``width`` units, plus noise."""
    return signal_weight * shared @ rng.normal(size=(5, width)) + rng.normal(size=(n, width))


model_a = {"related": layer(1.0, 300), "unrelated": layer(0.0, 300)}
model_b = {"related": layer(1.0, 200), "unrelated": layer(0.0, 200)}

# %% [markdown]
# ## Chance levels
#
# We compare with exact (whole-sample) `linear_cka`, the biased estimator of Kornblith et al., and
# `unbiased_cka`. In exact mode their chance levels come in closed form, at no cost: the exact expectation
# of the measure over all permutations of B's samples.

# %%
result = simkit.compare_arrays(model_a, model_b, metrics=["linear_cka", "unbiased_cka"], mode="exact",
                               progress=False)
frame = result.to_frame()
frame[["layer_a", "layer_b", "metric", "value", "chance", "beats_chance"]].round(3)

# %% [markdown]
# Read the `unrelated` × `unrelated` row of `linear_cka`: a value around 0.7 between two layers that share
# nothing. It is all bias: 300 and 200 noise units on 120 samples. Its chance level is just as high, so
# it does not beat chance. `unbiased_cka` removes that bias (chance level 0). The rule, as the reports
# state it:

# %%
print("linear_cka, closed form:", beats_chance_rule("linear_cka", 0))
print("with a 10-permutation null:", beats_chance_rule("linear_cka", 10))

# %% [markdown]
# "Beats chance" says a value is not noise. Whether it is large enough to matter is another question: the
# findings count the pairs that beat chance by a *large* margin (at least 20 % of the measure's range). In
# minibatch mode the CKA measures get a 10-permutation null of the per-batch Grams instead (about 1 % extra
# work); every other measure 5 permutations of the stored activations, an estimate of the level rather than
# a test. `null=K` asks any measure for K permutations.
#
# ## Confidence intervals
#
# `ci=0.95` adds `ci_low` and `ci_high` to every cell: for the other measures `ci_resamples` bootstrap
# resamples of the samples; for minibatch CKA a Poisson weight per batch, nearly free.

# %%
with_ci = simkit.compare_arrays(model_a, model_b, metrics=["unbiased_cka"], mode="exact", ci=0.95,
                                progress=False)
with_ci.to_frame()[["layer_a", "layer_b", "value", "ci_low", "ci_high"]].round(3)

# %% [markdown]
# ## Corrected p-values
#
# Beating a chance level is one decision per cell; a grid of L × L cells makes many decisions, and some
# pass by luck (with a 10-permutation null about one cell in eleven). `p_values=True` (`--p-values`) gives
# every cell a p-value from permutations of B's samples and corrects them across each measure's grid
# (`correction="holm"` by default: family-wise error at 5 %; `"bh"` false discovery rate); `beats_chance`
# then is the corrected decision. For CKA the p-value comes from the exact permutation moments (a Pearson
# type III fit), so it resolves far below 1/(K+1).

# %%
tested = simkit.compare_arrays(model_a, model_b, metrics=["unbiased_cka", "rsa"], p_values=True,
                               progress=False)
pd.set_option("display.float_format", "{:.3g}".format)
tested.to_frame()[["layer_a", "layer_b", "metric", "value", "p_value", "p_corrected", "beats_chance"]]

# %%
{metric: {key: row[key] for key in ("method", "permutations", "cells", "significant")}
 for metric, row in tested.summary["p_values"]["metrics"].items()}

# %% [markdown]
# Only the `related` × `related` cell beats chance, for both measures, after correction. The report says the
# same in its findings, marks the other cells with a dot, and names the correction:

# %%
tested

# %% [markdown]
# ## What to take from this
#
# - A value is evidence only beside its chance level: compare `value` with `chance`, never a value with a
#   fixed threshold, and never biased minibatch `linear_cka` across batch sizes.
# - "Beats chance" (or a corrected p-value under 0.05) says the layers share *something* beyond what
#   shuffled samples give; the interval and the large-margin count say how much.
# - Samples that are not exchangeable (several images of one class, trials of one subject): permute within
#   groups, `groups=labels` (`--groups FILE`).
#
# Every rule and its cost: [Chance levels, intervals, p-values](../chance-levels.md).
