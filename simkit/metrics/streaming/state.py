"""Declared streaming state, in the spirit of torchmetrics' ``add_state``: every streaming part lists its
states (``Part.states``), and the accumulator moves, merges, re-bases, saves and loads a part by iterating
them, whatever the part is.

Three kinds of state:

* :class:`Sums` (``sum``): named float64 tensors that add across batches and ranks; merging adds them.
* :class:`ShiftedSums` (``shifted_sum``): sums taken about a reference shift per column of each side
  (``x`` (P,) and ``y`` (Q,), the first batch's means, which keep large feature means from cancelling
  digits). Two such sums add only about the same shifts, so merging first re-bases the other's sums to
  this one's shifts (exact algebra in float64, given by the part: ``move``), and ranks agree on rank 0's
  shifts (:meth:`ShiftedSums.shifts` broadcast, then :meth:`ShiftedSums.rebase`).
* :class:`Rows` (``cat``): stored activations, one chunk per batch with its global batch index; merging
  appends, and ranks exchange them (:meth:`Rows.payload`, :meth:`Rows.load`: back in global batch order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from typing_extensions import Self

#: What :meth:`Rows.payload` hands over: global batch indices, and per stored batch the A and B activations
#: (one CPU tensor per layer).
StoredPayload = tuple[list[int], list[list[Tensor]], list[list[Tensor]]]


class State:
    """One declared state. The defaults are those of a state without that capability: no summed tensors,
    no shifts, nothing gathered across ranks."""

    #: tensors in :meth:`shifts` (and expected by :meth:`rebase`)
    shift_count = 0
    #: True when ranks exchange :meth:`payload` (stored rows) instead of summing :meth:`summed`
    gathered = False

    def to(self, device: torch.device) -> None:
        """Move the state's tensors to ``device``."""

    def summed(self) -> list[Tensor]:
        """The live float64 tensors that add across ranks (all-reduced in place)."""
        return []

    def shifts(self) -> list[Tensor]:
        """The reference shifts the sums are taken about (:attr:`shift_count` tensors)."""
        return []

    def rebase(self, shifts: Sequence[Tensor]) -> None:
        """Re-reference the sums to ``shifts`` (as :meth:`shifts` returns them, e.g. rank 0's)."""

    def merge(self, other: Self) -> None:
        """Fold in ``other`` (declared alike, fed other batches)."""
        raise NotImplementedError

    def payload(self) -> StoredPayload:
        """This process's gathered data, picklable, on the CPU (only for a :attr:`gathered` state)."""
        raise NotImplementedError

    def load(self, payloads: Sequence[StoredPayload], device: torch.device | str | None = None) -> None:
        """Replace the gathered data with all ``payloads`` (e.g. every rank's :meth:`payload`)."""
        raise NotImplementedError


class Sums(State):
    """``sum``: a named set of float64 tensors that add across batches and ranks (kept in insertion order)."""

    def __init__(self) -> None:
        self.t: dict[str, Tensor] = {}

    def add(self, name: str, *shape: int) -> None:
        """Declare the sum ``name``, zeros of ``shape``."""
        self.t[name] = torch.zeros(shape, dtype=torch.float64)

    def to(self, device: torch.device) -> None:
        if self.t and self.device != device:
            self.t = {k: v.to(device) for k, v in self.t.items()}

    @property
    def device(self) -> torch.device:
        """Where the sums are."""
        return next(iter(self.t.values())).device

    def summed(self) -> list[Tensor]:
        return list(self.t.values())

    def merge(self, other: Self) -> None:
        for k, v in self.t.items():
            v += other.t[k].to(v.device)

    def __getitem__(self, name: str) -> Tensor:
        return self.t[name]


#: ``move(sums, dx, dy)``: the part's exact re-referencing of its sums from shifts ``c`` to ``c − δ``
#: (``x'' = x' + dx``, ``y'' = y' + dy``), in place.
Move = Callable[["ShiftedSums", Tensor, Tensor], None]


class ShiftedSums(Sums):
    """``shifted_sum``: float64 sums of features taken about a reference shift per column, ``x`` (P,) for
    model A's concatenated layers and ``y`` (Q,) for B's: the first batch's means, until re-based.

    widths: ``(P, Q)``. move: how the part's sums follow a change of shifts (:data:`Move`)."""

    shift_count = 2

    def __init__(self, widths: tuple[int, int], move: Move) -> None:
        super().__init__()
        self.widths, self.move = widths, move
        self.shift: dict[str, Tensor | None] = {"x": None, "y": None}

    def offset(self, side: str, mean: Tensor) -> Tensor:
        """``δ = m − c``: how far a batch's mean ``m`` of ``side`` (``"x"`` or ``"y"``) lies from the
        reference shift ``c``, which the first batch sets to its own mean."""
        ref = self.shift[side]
        if ref is None:
            ref = self.shift[side] = mean.clone()
        return mean - ref.to(mean.device)

    def shifts(self) -> list[Tensor]:
        """The reference shifts ``[(P,), (Q,)]`` float64 (zeros before the first batch)."""
        return [t.clone() if (t := self.shift[k]) is not None else torch.zeros(width, dtype=torch.float64)
                for k, width in zip("xy", self.widths, strict=True)]

    def rebase(self, shifts: Sequence[Tensor]) -> None:
        """Re-reference every sum to new shifts ``[(P,), (Q,)]`` (exact algebra in float64).

        Precise when the new shifts are close to the old ones (e.g. another rank's first-batch means)."""
        new = {k: t.detach().double() for k, t in zip("xy", shifts, strict=True)}  # exact: never rounded
        old_x, old_y = self.shift["x"], self.shift["y"]
        if old_x is None or old_y is None:
            self.shift.update(new)
            return
        dev = self.device
        self.move(self, old_x.to(dev) - new["x"].to(dev), old_y.to(dev) - new["y"].to(dev))  # x'' = x' + δ
        self.shift.update({k: v.to(dev) for k, v in new.items()})

    def merge(self, other: Self) -> None:
        """Add ``other``'s sums after re-referencing them (in place) to this state's shifts."""
        if self.shift["x"] is None:
            self.shift = dict(other.shift)
        elif other.shift["x"] is not None:
            other.rebase(self.shifts())
        super().merge(other)


class Rows(State):
    """``cat``: stored activations, one chunk per batch (a tensor per layer of A and of B) with the batch's
    global index; :meth:`layers` puts them in global batch order."""

    gathered = True

    def __init__(self) -> None:
        self.chunks_a: list[list[Tensor]] = []
        self.chunks_b: list[list[Tensor]] = []
        self.indices: list[int] = []  # global batch index of every stored chunk (order of the data)
        self.n = 0

    def append(self, chunk_a: list[Tensor], chunk_b: list[Tensor], batch_index: int) -> None:
        """Store one batch's layers (same rows on both sides)."""
        self.chunks_a.append(chunk_a)
        self.chunks_b.append(chunk_b)
        self.indices.append(batch_index)
        self.n += len(chunk_a[0])

    def hold(self, xa: list[Tensor], xb: list[Tensor]) -> None:
        """Replace the stored rows with ``xa``, ``xb`` (every layer's samples, in order) as one chunk."""
        self.chunks_a, self.chunks_b, self.indices, self.n = [xa], [xb], [0], len(xa[0])

    def to(self, device: torch.device) -> None:
        self.chunks_a = [[t.to(device) for t in chunk] for chunk in self.chunks_a]
        self.chunks_b = [[t.to(device) for t in chunk] for chunk in self.chunks_b]

    def merge(self, other: Self) -> None:
        self.chunks_a += other.chunks_a
        self.chunks_b += other.chunks_b
        self.indices += other.indices
        self.n += other.n

    def payload(self) -> StoredPayload:
        """``(batch indices, chunks of A, chunks of B)``, tensors on the CPU."""
        return (list(self.indices), [[t.cpu() for t in c] for c in self.chunks_a],
                [[t.cpu() for t in c] for c in self.chunks_b])

    def load(self, payloads: Sequence[StoredPayload], device: torch.device | str | None = None) -> None:
        """Replace the stored rows with those of all ``payloads``, in global batch order, on ``device``
        (default: where this state's rows were)."""
        dev = device if device is not None else (self.chunks_a[0][0].device if self.chunks_a else None)
        merged = [(index, chunk_a, chunk_b) for indices, chunks_a, chunks_b in payloads
                  for index, chunk_a, chunk_b in zip(indices, chunks_a, chunks_b, strict=True)]
        merged.sort(key=lambda entry: entry[0])
        self.indices = [index for index, _, _ in merged]
        self.chunks_a = [[t.to(dev) for t in chunk_a] for _, chunk_a, _ in merged]
        self.chunks_b = [[t.to(dev) for t in chunk_b] for _, _, chunk_b in merged]
        self.n = sum(len(c[0]) for c in self.chunks_a)

    def layers(self, la: int, lb: int) -> tuple[list[Tensor], list[Tensor]]:
        """All stored samples per layer, in global batch order: ``[(n, p_i)]``, ``[(n, q_j)]``."""
        order = sorted(range(len(self.indices)), key=self.indices.__getitem__)
        xa = [torch.cat([self.chunks_a[k][i] for k in order]) for i in range(la)]
        xb = [torch.cat([self.chunks_b[k][j] for k in order]) for j in range(lb)]
        return xa, xb

    def nbytes(self) -> int:
        """Bytes of the stored activations."""
        return sum(sum(t.numel() * t.element_size() for t in c) for c in self.chunks_a + self.chunks_b)
