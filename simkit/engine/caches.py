"""Writing an activation cache: run a model over the data once, store the chosen layers' activations.

The format (shards + ``manifest.json``, written last) and its readers are in ``simkit.engine.sources``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from simkit import distributed
from simkit.engine.batches import check_batch_size, count_rows, data_label, global_batches, steps
from simkit.engine.comparison import weights_of
from simkit.engine.sources import FORMAT, MANIFEST, Tap
from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.io import atomic_write, write_json
from simkit.layers import resolve_layers
from simkit.progress import progress_bar
from simkit.provenance import run_meta
from simkit.rundir import check_run_path, release_lock, take_lock


class SampleDigest:
    """The sha256 of the samples a cache holds, content and order, fed batch by batch (no batch is kept).

    ``result(rows)`` → ``(hex, what it covers)``: a text Dataset (``info["texts_sha256"]``, one digest per
    line) by its first ``rows`` texts, so caches of one text file read through different models'
    tokenizers still match; anything else by the bytes of its input batches (a dict by key), in order.
    """

    def __init__(self, data: Any):
        info = getattr(data, "info", None)
        self.texts = info.get("texts_sha256") if isinstance(info, dict) else None
        self.hash = hashlib.sha256()
        self.started = False

    def add(self, batch: Any) -> None:
        """Hash one batch of inputs; the digest does not depend on how the samples were split into batches."""
        if self.texts is not None:
            return
        parts = [batch] if isinstance(batch, torch.Tensor) else [batch[key] for key in sorted(batch)]
        if not self.started:  # each input's dtype and sample shape, once
            self.hash.update(str([(part.dtype, tuple(part.shape[1:])) for part in parts]).encode())
            self.started = True
        for part in parts:
            self.hash.update(part.detach().cpu().contiguous().numpy().tobytes())

    def result(self, rows: int) -> tuple[str, str]:
        if self.texts is not None:
            for line in self.texts[:rows]:
                self.hash.update(bytes.fromhex(line))
            return self.hash.hexdigest(), "texts"
        return self.hash.hexdigest(), "inputs"


def capture(model: nn.Module, data: Any, out: str | Path, *, layers: str | Sequence[str] = "blocks",
            reduce: str = "auto", batch_size: int = 64, n: int | None = None,
            device: str | torch.device = "cpu", output_index: Any = None, shard_bytes: int = 256 * 2**20,
            dtype: torch.dtype = torch.float32, model_name: str = "model", data_name: str | None = None,
            seed: int = 0, progress: bool = True, data_seed: int | None = None) -> Path:
    """Run ``model`` over ``data`` once and write the chosen layers' activations to the cache ``out``.

    Activations are reduced to (n, dim) per layer and stored in ``dtype``; shards hold about
    ``shard_bytes`` each. ``model_name``, ``data_name`` (default: a Dataset's spec) and ``seed`` are
    recorded in the manifest (and ``data_seed``, the seed the data was made with, when given), with
    ``samples_sha256`` (:class:`SampleDigest`), which
    ``compare_caches`` and ``study`` check. ``reduce``: as in ``simkit.layers`` (``auto``: the mask-aware
    mean over a token sequence, flatten otherwise). Returns the cache directory.
    """
    if isinstance(model, str):
        raise SimkitError(f"`model` is a spec string ({model!r}); load it first with "
                          "simkit.models.load_model(spec)")
    if not isinstance(model, nn.Module):
        raise SimkitError(f"`model` must be an nn.Module, got {type(model).__name__}")
    if isinstance(data, str):
        raise SimkitError(f"`data` is a spec string ({data!r}); load it first with simkit.data.load_data(spec)")
    check_batch_size(batch_size)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise SimkitError(f"`n` must be a positive integer (or None for all samples), got {n!r}")
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise SimkitError(f"`shard_bytes` must be a positive integer, got {shard_bytes!r}")
    if distributed.is_distributed():
        raise SimkitError("simkit capture runs in one process; launch it without torchrun")
    resolved = resolve_device(device)
    chosen = resolve_layers(model, layers)
    path = Path(out)
    check_run_path(path, "out")
    started_writing = False

    def start_writing() -> None:
        """The first write, once the first batch went through: an earlier cache there stops being one."""
        nonlocal started_writing
        if not started_writing:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SimkitError(f"cannot create the cache directory {path} ({exc.strerror}); choose "
                                  "another `out`") from None
            take_lock(path, "capture")  # one writer at a time; released by the command or below
            (path / MANIFEST).unlink(missing_ok=True)
            started_writing = True

    model.to(resolved)
    shards: list[dict[str, Any]] = []
    pending: list[list[torch.Tensor]] = []
    pending_bytes = 0
    rows = 0
    dims: list[int] = []
    started = time.perf_counter()

    def flush() -> None:
        nonlocal pending, pending_bytes
        if not pending:
            return
        tensors = {name: torch.cat([part[i] for part in pending]).contiguous() for i, name in enumerate(chosen)}
        name = f"shard-{len(shards):05d}.safetensors"
        atomic_write(path / name, lambda p: save_file(tensors, str(p)))
        shards.append({"file": name, "rows": int(next(iter(tensors.values())).shape[0])})
        pending, pending_bytes = [], 0

    digest = SampleDigest(data)
    bar = progress_bar(progress)
    task = bar.add_task("capture", total=steps(count_rows(data), n, batch_size))
    with Tap(model, chosen, model_name, reduce=reduce, output_index=output_index, device=resolved) as tap, bar:
        for _, batch in global_batches(data, batch_size, n):
            digest.add(batch)
            acts = [a.detach().to("cpu", dtype) for a in tap.step(batch)]
            start_writing()
            dims = [int(a.shape[1]) for a in acts]
            pending.append(acts)
            pending_bytes += sum(a.numel() * a.element_size() for a in acts)
            rows += int(acts[0].shape[0])
            if pending_bytes >= shard_bytes:
                flush()
            bar.advance(task)
        flush()
        layer_rows = tap.layer_rows("a", dims) if rows else []
    if not rows:
        raise SimkitError("the data yielded no samples; check `data` and `n`")
    start_writing()
    samples_sha256, digest_of = digest.result(rows)
    manifest = run_meta(
        format=FORMAT, model=model_name, weights=weights_of(model), data=data_label(data, data_name), n=rows,
        seed=seed, **({} if data_seed is None else {"data_seed": data_seed}),
        samples_sha256=samples_sha256, samples_digest_of=digest_of,
        batch_size=batch_size, reduce=reduce, dtype=str(dtype).replace("torch.", ""),
        layers=[{k: v for k, v in row.items() if k != "model"} for row in layer_rows],
        shards=shards, seconds=round(time.perf_counter() - started, 3),
    )
    write_json(path / MANIFEST, manifest)
    release_lock(path)
    return path
