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
# # Bring your own activations
#
# Activations you already hold (from thingsvision or Net2Brain, Hugging Face `output_hidden_states`, a
# TransformerLens `ActivationCache`, nnsight, a recording from a brain) are compared as two models are:
# every measure, both modes, chance levels, intervals, studies and the report. A layer is an array of
# shape (samples, features...), one row per sample. This page builds two such sets by hand: a network's
# hidden layers, and a simulated "recording" of the same stimuli in another order, with some missing.

# %%
import tempfile
from pathlib import Path

import numpy as np
import torch

import simkit
from simkit.data import load_data
from simkit.models import load_model

data = load_data("digits", n=600)
model = load_model("simkit:mlp:in_features=64,hidden=64,depth=2", seed=0)
simkit.train_classifier(model, data, simkit.TrainConfig(epochs=10, lr=3e-3, progress=False))

# the network's activations, one array per layer, recorded with a forward hook
acts: dict[str, np.ndarray] = {}
hooks = [model.get_submodule(name).register_forward_hook(
    lambda module, inputs, output, name=name: acts.__setitem__(name, output.flatten(1).detach().numpy()))
    for name in ("blocks.0", "blocks.1", "head")]
with torch.no_grad():
    model(data.inputs)
for hook in hooks:
    hook.remove()
stimulus_ids = np.array([f"img{i:04d}" for i in range(len(data))])
{name: array.shape for name, array in acts.items()}

# %% [markdown]
# The "recording": two areas that read the network's first and last hidden layers through a random mixing
# and noise, stored in a shuffled order with 50 stimuli missing. Only the IDs say which row is which.

# %%
rng = np.random.default_rng(0)
order = rng.permutation(len(data))[:550]           # shuffled, 50 stimuli never recorded
first, last = "blocks.0", "blocks.1"
recording = {
    "area_v": acts[first][order] @ rng.normal(size=(acts[first].shape[1], 40)) + rng.normal(size=(550, 40)),
    "area_it": acts[last][order] @ rng.normal(size=(acts[last].shape[1], 40)) + rng.normal(size=(550, 40)),
}
recording_ids = stimulus_ids[order]

# %% [markdown]
# ## Compare, matched by sample IDs
#
# `simkit.compare_arrays` takes mappings `{layer: array}` (NumPy arrays, torch tensors, dict-likes), file
# paths or caches. With IDs on both sides the samples present in both are compared, in A's order; without
# IDs both sides must have the same rows in the same order.

# %%
result = simkit.compare_arrays(acts, recording, ids_a=stimulus_ids, ids_b=recording_ids,
                               names=("mlp", "recording"), metrics=["unbiased_cka", "procrustes"],
                               progress=False)
result.summary["samples"]

# %% [markdown]
# `summary.samples` says how the rows were aligned, how many matched and how many each side dropped; the
# report's findings say it too.

# %%
result

# %% [markdown]
# ## From files
#
# Files work the same way: `.npy` (one layer), a directory of `.npy` files, `.npz` and `.safetensors` (a
# layer per key), `.pt` (a dict of tensors), `.h5` (extra `[h5]`). An entry named `ids` holds the sample
# IDs and `attention_mask` the token mask of 3-D layers; neither is a layer. `simkit.load_activations`
# reads a file into a source (read in row chunks, never whole), and `compare_arrays` takes either.

# %%
folder = Path(tempfile.mkdtemp())
np.savez(folder / "mlp.npz", ids=stimulus_ids, **acts)
np.savez(folder / "recording.npz", ids=recording_ids, **recording)
source = simkit.load_activations(folder / "recording.npz")
from_files = simkit.compare_arrays(folder / "mlp.npz", source, metrics=["unbiased_cka"], progress=False)
from_files.matrix("unbiased_cka").round(3)

# %% [markdown]
# The values are those of the arrays in memory: the same samples, the same measure.

# %%
in_memory = result.matrix("unbiased_cka")
float((from_files.matrix("unbiased_cka") - in_memory).abs().max().max())

# %% [markdown]
# ## Token sequences
#
# A 3-D layer is read as a token sequence (samples, tokens, features). Its default reduction (`reduce="auto"`)
# is the mean over the tokens, weighted by the source's `attention_mask` so that padding does not count;
# `reduce="cls"` or `"last"` take the first or last real token. (Tokens or positions as the samples
# themselves are not implemented yet: every layer gives one vector per sample.)

# %%
torch.manual_seed(0)
tokens = torch.randn(200, 12, 16)
mask = (torch.arange(12) < torch.randint(4, 13, (200, 1))).long()   # padded sequences of 4–12 tokens
a = {"embed": tokens, "attention_mask": mask}
b = {"proj": tokens @ torch.randn(16, 8), "attention_mask": mask}
simkit.compare_arrays(a, b, metrics=["unbiased_cka"], progress=False).matrix("unbiased_cka").round(3)

# %% [markdown]
# The command line takes the same files:
#
#     simkit compare mlp.npz recording.npz --out runs/mlp-vs-recording
#     simkit compare A.npz B.h5 --ids-a ids_a.txt --ids-b ids_b.csv --ids-column stimulus --out DIR
#
# Every format, the Hugging Face, TransformerLens and nnsight recipes: [Bring your own
# activations](../activations.md).
