"""Turn what users pass as data into a stream of global input batches, strided over torchrun ranks.

Accepted: a Tensor (first axis = samples), a dict of tensors (tokenised text), a
``simkit.data.Dataset``, a map-style dataset (``torch.utils.data.TensorDataset`` or any object with
``__getitem__`` and ``__len__`` whose items are one sample: a tensor, ``(x, y, ...)`` or a dict; read
``batch_size`` items at a time and stacked), or any iterable of batches (a DataLoader yielding tensors,
``(x, y)`` tuples or dicts). Batches are defined globally (batch ``i`` holds the same samples whatever the number
of processes); under torchrun each rank takes every ``world_size``-th batch. Every batch comes with
its global index ``i``, which the accumulators need (it seeds the minibatch null and orders stored
samples) and which only this module knows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from simkit.errors import SimkitError
from simkit.forward import Batch, batch_rows
from simkit.forward import take as take_rows

__all__ = ["Batch", "batch_rows", "check_batch_size", "count_rows", "data_label", "global_batches", "rebatch", "steps"]


def _checked(batch: Batch) -> Batch:
    """``batch``; a dict of inputs must hold tensors (a NumPy array or a list there is a SimkitError naming ``data``)."""
    if isinstance(batch, dict):
        for key, value in batch.items():
            if not isinstance(value, torch.Tensor):
                raise SimkitError(f"`data`[{key!r}] is a {type(value).__name__}; a dict of inputs must hold torch "
                                  "tensors (samples, ...): convert it with torch.as_tensor(...)")
    return batch


def _inputs_of(item: Any) -> Batch:
    """The model inputs of one item yielded by a user's iterable: x, (x, y, ...) or a dict."""
    if isinstance(item, torch.Tensor | dict):
        return _checked(item)
    if isinstance(item, list | tuple) and item and isinstance(item[0], torch.Tensor | dict):
        return _checked(item[0])
    raise SimkitError(f"cannot read a batch of type {type(item).__name__} from `data`; pass a Tensor, a dict of "
                      "tensors, a simkit Dataset or an iterable yielding tensors or (inputs, labels)")


def _is_dataset(data: Any) -> bool:
    """A simkit Dataset: sized, with ``rows(start, stop)`` (which may generate samples lazily)."""
    return hasattr(data, "rows") and hasattr(data, "__len__")


def _is_map_style(data: Any) -> bool:
    """A map-style dataset of single samples (``TensorDataset``, any ``__getitem__`` + ``__len__``); a list
    or tuple is an iterable of batches, as before, and a Tensor, dict or simkit Dataset has its own path."""
    return (hasattr(data, "__getitem__") and hasattr(data, "__len__")
            and not isinstance(data, torch.Tensor | dict | list | tuple | str) and not _is_dataset(data))


def _map_rows(data: Any) -> Callable[[int, int], Batch]:
    """``rows(start, stop)`` of a map-style dataset: its items ``start`` … ``stop - 1``, stacked."""

    def rows(start: int, stop: int) -> Batch:
        items = [_sample_inputs(_item(data, i), i) for i in range(start, stop)]
        if isinstance(items[0], dict):
            return {key: torch.stack([item[key] for item in items]) for key in items[0]}  # type: ignore[index]
        return torch.stack(items)  # type: ignore[arg-type]

    return rows


def _sample_inputs(item: Any, index: int) -> torch.Tensor | dict[str, torch.Tensor]:
    """The model inputs of one item of a map-style dataset: x, (x, y, ...) or a dict of tensors."""
    inputs = item[0] if isinstance(item, list | tuple) and item else item
    if isinstance(inputs, dict) and all(isinstance(v, torch.Tensor) for v in inputs.values()):
        return inputs
    if isinstance(inputs, torch.Tensor):
        return inputs
    try:  # numbers that are not a tensor (a numpy row): floating point as float32, as simkit.data reads them
        tensor = torch.as_tensor(inputs)
        return tensor.float() if tensor.is_floating_point() else tensor
    except (TypeError, ValueError, RuntimeError):
        raise SimkitError(f"item {index} of the data holds a {type(inputs).__name__}; a map-style dataset's "
                          "items must be a tensor, (inputs, labels) or a dict of tensors") from None


def _item(data: Any, index: int) -> Any:
    """``data[index]``; a map-style dataset that cannot give it is a SimkitError naming its type."""
    try:
        return data[index]
    except (KeyError, IndexError, TypeError) as exc:
        raise SimkitError(f"data of type {type(data).__name__} has no item {index} ({type(exc).__name__}: "
                          f"{str(exc)[:80]}); pass a Tensor, a map-style dataset whose items 0 … len - 1 are "
                          "samples, or a DataLoader") from None


def count_rows(data: Any) -> int | None:
    """The number of samples when known without iterating, else None."""
    if _is_dataset(data) or _is_map_style(data):
        return len(data)
    if isinstance(data, torch.Tensor | dict):
        return batch_rows(data)
    return None


def data_label(data: Any, data_name: str | None = None) -> str:
    """The data's name in results: ``data_name``, else a simkit Dataset's spec, else the type's name."""
    if data_name is not None:
        return data_name
    spec = getattr(data, "spec", None)
    return spec if _is_dataset(data) and isinstance(spec, str) else type(data).__name__


def steps(total: int | None, n: int | None, batch_size: int) -> int | None:
    """Global batches of ``batch_size`` over ``min(total, n)`` samples (None when ``total`` is unknown)."""
    if total is None:
        return None
    if n is not None:
        total = min(total, n)
    return -(-total // batch_size)


def check_batch_size(batch_size: int) -> None:
    """Raise unless ``batch_size`` is a positive integer."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SimkitError(f"`batch_size` must be a positive integer, got {batch_size!r}")


def global_batches(data: Any, batch_size: int, n: int | None = None, *, rank: int = 0,
                   world_size: int = 1) -> Iterator[tuple[int, Batch]]:
    """Yield ``(global index, batch)`` for this rank's input batches of at most ``batch_size`` rows,
    ``n`` samples in all at most.

    data: Tensor (N, ...), dict of (N, ...) tensors, Dataset, a map-style dataset of single samples, or an
    iterable of batches.
    """
    check_batch_size(batch_size)
    if _is_dataset(data) or _is_map_style(data) or isinstance(data, torch.Tensor | dict):
        _checked(data)
        known = len(data) if _is_dataset(data) or _is_map_style(data) else batch_rows(data)
        total = known if n is None else min(n, known)
        rows: Callable[[int, int], Batch] = data.rows if _is_dataset(data) else _map_rows(data) \
            if _is_map_style(data) else (lambda start, stop: take_rows(data, slice(start, stop)))
        for index, start in enumerate(range(0, total, batch_size)):
            if index % world_size == rank:
                yield index, rows(start, min(start + batch_size, total))
        return
    if not isinstance(data, Iterable):
        raise SimkitError(f"data of type {type(data).__name__} is not iterable; pass a Tensor, a "
                          "Dataset (map-style: __getitem__ and __len__) or a DataLoader")
    yield from rebatch((_inputs_of(item) for item in data), batch_size, n, rank, world_size)


def _form(batch: Batch) -> Any:
    """What must agree between pieces joined into one batch: the per-sample shape, or a dict's keys and theirs."""
    if isinstance(batch, dict):
        return {key: tuple(getattr(value, "shape", ())[1:]) for key, value in batch.items()}
    return tuple(batch.shape[1:])


def _check_same_form(parts: list[Batch]) -> None:
    """Raise unless the pieces of one global batch (from consecutive batches of ``data``) can be joined."""
    forms = [_form(part) for part in parts]
    other = next((form for form in forms if form != forms[0]), None)
    if other is not None:
        raise SimkitError(f"the batches of `data` differ in the shape of a sample: {forms[0]} then {other}; every "
                          "batch must hold samples of one shape (the same keys for dicts)")


def rebatch(stream: Iterable[Batch], batch_size: int, n: int | None, rank: int,
            world_size: int) -> Iterator[tuple[int, Batch]]:
    """Cut a stream of arbitrary-size batches into global batches of ``batch_size`` rows; yield this
    rank's as ``(global index, batch)``."""
    check_batch_size(batch_size)
    pending: list[Batch] = []
    pending_rows = 0
    seen = 0
    index = 0

    def emit(parts: list[Batch]) -> Batch:
        first = parts[0]
        if len(parts) > 1:
            _check_same_form(parts)
        if isinstance(first, dict):
            return {key: torch.cat([p[key] for p in parts if isinstance(p, dict)]) for key in first}
        return torch.cat([p for p in parts if isinstance(p, torch.Tensor)]) if len(parts) > 1 else first

    for batch in stream:
        rows = batch_rows(batch)
        if n is not None and seen + rows > n:
            batch, rows = take_rows(batch, slice(0, n - seen)), n - seen
        seen += rows
        while rows:
            take = min(rows, batch_size - pending_rows)
            pending.append(take_rows(batch, slice(0, take)))
            pending_rows += take
            batch, rows = take_rows(batch, slice(take, rows)), rows - take
            if pending_rows == batch_size:
                if index % world_size == rank:
                    yield index, emit(pending)
                index += 1
                pending, pending_rows = [], 0
        if n is not None and seen >= n:
            break
    if pending and index % world_size == rank:
        yield index, emit(pending)
