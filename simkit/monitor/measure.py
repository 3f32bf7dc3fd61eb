"""One measurement: the probe activations of the model against the reference's, every layer pair with
its chance level, through the engine's accumulator and its long table.

The stored ``(n, d)`` activations are fed to ``simkit.metrics.streaming.make_accumulator`` in batches of
``batch_size`` (each with its index, which seeds the minibatch null), and ``simkit.engine.assemble``'s
``similarity_frame`` turns the matrices into rows with ``chance`` and ``beats_chance`` exactly as
``simkit.compare`` does. One process: a monitor measures on rank 0 only, so nothing here is reduced
over ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from simkit.engine.assemble import similarity_frame
from simkit.errors import SimkitError
from simkit.metrics.streaming import make_accumulator
from simkit.metrics.streaming.minibatch import GramMemo
from simkit.settings.monitor import ProbeSettings

#: the columns of the long table (``steps.csv``), in order; ``null_p95`` only with a permutation null
COLUMNS = ("step", "metric", "layer", "reference_layer", "depth", "reference_depth", "value", "chance", "null_p95",
           "beats_chance")


def check_pairs(layers: Sequence[str], reference_layers: Sequence[str], pairs: str) -> None:
    """``pairs="same"`` needs one reference layer per layer (a SimkitError saying how to fix it)."""
    if pairs == "same" and len(layers) != len(reference_layers):
        raise SimkitError(f"`pairs` same pairs each layer with the reference's layer at its position, but there "
                          f"are {len(layers)} layers and {len(reference_layers)} reference layers; choose as many "
                          "`reference_layers` as `layers`, or use `pairs` all")


def measure_step(step: int, acts: Sequence[torch.Tensor], reference: Sequence[torch.Tensor],
                 layers: Sequence[str], reference_layers: Sequence[str], settings: ProbeSettings,
                 memo: GramMemo | None = None) -> pd.DataFrame:
    """The rows of one step (:data:`COLUMNS`): every layer pair's value, chance level and whether it beats
    chance (:func:`chosen_pairs` keeps those of ``settings.pairs``). acts, reference: one ``(n, d)`` tensor
    per layer of each side, the same n samples. memo: the reference's Grams kept between steps when the
    reference does not change (a fixed model, the first step, the final step at the end)."""
    if acts[0].shape[0] != reference[0].shape[0]:
        raise SimkitError(f"the probe gave {acts[0].shape[0]} samples but the reference {reference[0].shape[0]}; "
                          "both must see the same probe set")
    chosen = settings.compare_settings()
    accumulator = make_accumulator(chosen, [a.shape[1] for a in acts], [r.shape[1] for r in reference],
                                   names_a=list(layers), names_b=[f"{name} (reference)" for name in reference_layers],
                                   memo_b=memo)
    device = acts[0].device
    size = settings.batch_size
    for index, start in enumerate(range(0, acts[0].shape[0], size)):
        accumulator.update([a[start:start + size] for a in acts],
                           [r[start:start + size].to(device) for r in reference], batch_index=index)
    values = accumulator.compute()
    drawn = {metric: int(described.get("null") or 0) for metric, described in accumulator.describe().items()}
    frame = similarity_frame(values, list(layers), list(reference_layers), drawn)
    return tidy(frame, step, list(layers), list(reference_layers))


def tidy(frame: pd.DataFrame, step: int, layers: list[str], reference_layers: list[str]) -> pd.DataFrame:
    """The engine's long table as the monitor's rows: named columns, the step and each side's depth."""
    frame = frame.rename(columns={"layer_a": "layer", "layer_b": "reference_layer"})
    frame.insert(0, "step", int(step))
    frame["depth"] = frame["layer"].map({name: depth for depth, name in enumerate(layers)}).astype(int)
    frame["reference_depth"] = frame["reference_layer"].map(
        {name: depth for depth, name in enumerate(reference_layers)}).astype(int)
    return frame[[c for c in COLUMNS if c in frame.columns]].reset_index(drop=True)


def chosen_pairs(frame: pd.DataFrame, pairs: str) -> pd.DataFrame:
    """The rows of ``pairs``: ``same`` (each layer with the reference layer at its position) or ``all``."""
    if pairs == "all":
        return frame
    return frame[frame["depth"] == frame["reference_depth"]].reset_index(drop=True)
