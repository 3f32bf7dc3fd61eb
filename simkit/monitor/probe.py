"""The probe set and its activations: fixed inputs, one forward pass per measurement, nothing disturbed.

``probe_inputs(data, n)`` takes the first ``n`` samples of a tensor, a dict of tensors, a simkit
``Dataset``, a map-style dataset or a DataLoader (its first batches) once, on the CPU.
``probe_activations(model, inputs, layers, ...)`` records the chosen layers' outputs on those inputs, one
``(n, d)`` tensor per layer, in eval mode under ``no_grad``, and leaves the model as it found it: every
submodule's train/eval flag, the grad mode, the random number generators (torch's CPU and CUDA
generators, Python's ``random`` and NumPy's global one) and no hook left behind (``simkit.layers.record_layers``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from simkit.engine.batches import global_batches
from simkit.errors import SimkitError
from simkit.forward import Batch, batch_rows, run_model, take, to_device
from simkit.layers import record_layers


def probe_inputs(data: Any, n: int) -> Batch:
    """The first ``n`` samples of ``data`` (fewer when it holds fewer) as one CPU batch (n, ...)."""
    if isinstance(data, str):
        raise SimkitError(f"`probe` is a spec string ({data!r}); load it first with simkit.data.load_data(spec)")
    first = next(iter(global_batches(data, batch_size=n, n=n)), None)
    if first is None:
        raise SimkitError("`probe` holds no samples; pass a tensor, a Dataset or a DataLoader with at least 4")
    batch = first[1]
    inputs = {k: v.detach().cpu().clone() for k, v in batch.items()} if isinstance(batch, dict) \
        else batch.detach().cpu().clone()  # a copy: the user's data may change later
    if batch_rows(inputs) < 4:
        raise SimkitError(f"`probe` holds {batch_rows(inputs)} samples; a similarity needs at least 4")
    return inputs


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s first parameter (or buffer) lives; the CPU for a model without any."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


@contextmanager
def rng_kept(device: torch.device) -> Iterator[None]:
    """Every random number generator a forward pass might draw from is as it was after the block: torch's
    CPU generator and ``device``'s CUDA generator, Python's ``random`` and NumPy's global generator."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def probe_activations(model: nn.Module, inputs: Batch, layers: Sequence[str], *, batch_size: int,
                      reduce: str = "auto", device: torch.device | None = None) -> list[torch.Tensor]:
    """One ``(n, d_i)`` tensor per layer of ``layers`` (resolved names) on the probe ``inputs``, on
    ``device`` (default: the model's); the model's modes, the grad mode and the generators untouched
    afterwards, no hook left behind."""
    target = device or model_device(model)
    n = batch_rows(inputs)
    parts: list[list[torch.Tensor]] = [[] for _ in layers]
    with rng_kept(target), record_layers(model, list(layers), reduce=reduce) as recorder:
        for start in range(0, n, batch_size):
            run_model(model, to_device(take(inputs, slice(start, start + batch_size)), target))
            for part, acts in zip(parts, recorder.pop().values(), strict=True):
                part.append(acts.detach().clone())
    return [torch.cat(part) for part in parts]
