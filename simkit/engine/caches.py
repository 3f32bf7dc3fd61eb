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
from simkit.engine.sources import FORMAT, MANIFEST, Tap
from simkit.errors import SimkitError
from simkit.faults import phase
from simkit.forward import resolve_device
from simkit.io import atomic_write, write_json
from simkit.layers import resolve_layers
from simkit.progress import progress_bar
from simkit.provenance import run_meta, weights_of
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
            if part.device.type == "meta":
                raise SimkitError("`data` holds tensors on the meta device (shapes without values); give real inputs")
            # the bytes as they are (any dtype: bfloat16 has no NumPy type)
            self.hash.update(part.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())

    def result(self, rows: int) -> tuple[str, str]:
        if self.texts is not None:
            for line in self.texts[:rows]:
                self.hash.update(bytes.fromhex(line))
            return self.hash.hexdigest(), "texts"
        return self.hash.hexdigest(), "inputs"


def capture(model: nn.Module, data: Any, out: str | Path, *,
            layers: str | Sequence[str] = "blocks", reduce: str = "auto", batch_size: int = 64, n: int | None = None,
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
    check_capture(batch_size, n, shard_bytes)
    resolved = resolve_device(device)
    chosen = resolve_layers(model, layers)
    path = Path(out)
    check_run_path(path, "out")
    model.to(resolved)
    writer = CacheWriter(path, chosen, shard_bytes)
    started = time.perf_counter()
    digest = SampleDigest(data)
    bar = progress_bar(progress)
    task = bar.add_task("capture", total=steps(count_rows(data), n, batch_size))
    with Tap(model, chosen, model_name, reduce=reduce, output_index=output_index, device=resolved) as tap, bar:
        for _, batch in global_batches(data, batch_size, n):
            digest.add(batch)
            writer.add([a.detach().to("cpu", dtype) for a in tap.step(batch)])
            bar.advance(task)
        writer.flush()
        layer_rows = tap.layer_rows("a", writer.dims) if writer.rows else []
    if not writer.rows:
        raise SimkitError("the data yielded no samples; check `data` and `n`")
    samples_sha256, digest_of = digest.result(writer.rows)
    dtype_of_model = getattr(model, "simkit_dtype", None)
    manifest = run_meta(
        format=FORMAT, model=model_name, weights=weights_of(model), data=data_label(data, data_name), n=writer.rows,
        seed=seed, **({} if data_seed is None else {"data_seed": data_seed}),
        samples_sha256=samples_sha256, samples_digest_of=digest_of,
        batch_size=batch_size, reduce=reduce, dtype=str(dtype).replace("torch.", ""),
        **({} if dtype_of_model is None else {"model_dtype": dtype_of_model}),
        layers=[{k: v for k, v in row.items() if k != "model"} for row in layer_rows],
        shards=writer.shards, seconds=round(time.perf_counter() - started, 3),
    )
    writer.finish(manifest)
    return path


def check_capture(batch_size: int, n: int | None, shard_bytes: int) -> None:
    """The sizes of a capture (``batch_size``, ``n``, ``shard_bytes``), and one process only."""
    check_batch_size(batch_size)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise SimkitError(f"`n` must be a positive integer (or None for all samples), got {n!r}")
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise SimkitError(f"`shard_bytes` must be a positive integer, got {shard_bytes!r}")
    if distributed.is_distributed():
        raise SimkitError("simkit capture runs in one process; launch it without torchrun")


class CacheWriter:
    """The shards of a cache written as activations arrive, about ``shard_bytes`` each. The first write
    takes the directory (created, locked for this writer, an earlier cache's manifest removed, so it stops
    being a cache); :meth:`finish` writes the manifest last and releases the lock."""

    def __init__(self, path: Path, layers: Sequence[str], shard_bytes: int):
        self.path, self.layers, self.shard_bytes = path, list(layers), shard_bytes
        self.shards: list[dict[str, Any]] = []
        self.pending: list[list[torch.Tensor]] = []
        self.pending_bytes = self.rows = 0
        self.dims: list[int] = []
        self.started = False

    def start(self) -> None:
        """The first write (once): create and lock the directory, remove an earlier manifest."""
        if self.started:
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SimkitError(f"cannot create the cache directory {self.path} ({exc.strerror}); choose "
                              "another `out`") from None
        take_lock(self.path, "capture")  # one writer at a time; released by the command or by finish
        (self.path / MANIFEST).unlink(missing_ok=True)
        self.started = True

    def add(self, acts: list[torch.Tensor]) -> None:
        """One batch: one (b, d) CPU tensor per layer, in layer order."""
        dims = [int(a.shape[1]) for a in acts]
        changed = [i for i, (before, now) in enumerate(zip(self.dims or dims, dims, strict=True)) if before != now]
        if changed:
            raise SimkitError(f"layer {self.layers[changed[0]]!r} gave {dims[changed[0]]} features per sample after "
                              f"{self.dims[changed[0]]}; every batch of `data` must hold samples of one shape")
        self.start()
        self.dims = dims
        self.pending.append(acts)
        self.pending_bytes += sum(a.numel() * a.element_size() for a in acts)
        self.rows += int(acts[0].shape[0])
        if self.pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the pending batches as one shard."""
        if not self.pending:
            return
        tensors = {name: torch.cat([part[i] for part in self.pending]).contiguous()
                   for i, name in enumerate(self.layers)}
        name = f"shard-{len(self.shards):05d}.safetensors"
        atomic_write(self.path / name, lambda p: save_file(tensors, str(p)))
        self.shards.append({"file": name, "rows": int(next(iter(tensors.values())).shape[0])})
        self.pending, self.pending_bytes = [], 0
        phase("capturing")

    def finish(self, manifest: dict[str, Any]) -> None:
        """Write ``manifest`` (the cache is complete from then on) and release the directory."""
        self.start()
        write_json(self.path / MANIFEST, manifest)
        release_lock(self.path)
