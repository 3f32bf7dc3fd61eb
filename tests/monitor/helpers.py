"""What the monitor's tests share: a tiny model and data, a plain training loop, and readers of what the
trackers wrote (TensorBoard event files, MLflow's file store, a W&B offline run)."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import torch

CNN = "simkit:cnn1d:channels=8"


def tiny(seed: int = 0, n: int = 256):
    """(model in train mode, its mnist1d data)."""
    from simkit.data import load_data
    from simkit.models import load_model

    model = load_model(CNN, seed=seed)
    model.train()
    return model, load_data("mnist1d", n=n)


def train(model, data, steps: int, on_step=None, seed: int = 0, lr: float = 1e-2) -> None:
    """``steps`` Adam steps on random batches of 32; ``on_step(step)`` after each (step 0 before the first)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps + 1):
        if on_step is not None:
            on_step(step)
        if step == steps:
            break
        index = torch.randint(0, len(data), (32,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(data.inputs[index]), data.labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def tensorboard_events(folder: Path):
    """TensorBoard's own reader over the event files in ``folder`` (every scalar and image kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    reader.Reload()
    return reader


def wandb_records(run_file: Path) -> list:
    """The records of a W&B offline run file (``run-<id>.wandb``): a LevelDB-style log of W&B's protobuf
    ``Record`` messages after a 7-byte header, in 32 KiB blocks of (crc, length, type) chunks."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    block, position, raw, pending = 32768, 7, [], b""
    while position + 7 <= len(data):
        room = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if room < 7 or (length == 0 and kind == 0):
            position += room
            continue
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            raw.append(pending)
    records = []
    for message in raw:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(message)
        records.append(record)
    return records


def wandb_history(run_file: Path, timeout: float = 30.0) -> list[dict[str, str]]:
    """The history rows of a finished W&B offline run, once its writer has written the run's exit record
    (W&B's service process may still be writing when ``run.finish()`` returns)."""
    deadline = time.monotonic() + timeout
    records = wandb_records(run_file)
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < deadline:
        time.sleep(0.1)
        records = wandb_records(run_file)
    return [{"/".join(item.nested_key) or item.key: item.value_json for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
