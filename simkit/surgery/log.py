"""The graft log: every mutation as a JSON-able record, so an architecture can be rebuilt by replay.

Records: ``{"op": "graft", "after", "branch": spec, "gate", "alpha", "optimizer", ...}``,
``{"op": "replace" | "insert_after", "name", "module": class path}``. Built-in branches are rebuilt
from their spec (same seed → same initial weights); user modules are supplied to :meth:`replay`.
Replaying onto a freshly built base model (and its fresh optimizer) gives the architecture and
optimizer layout of the logged run; the trained values then come from its checkpoint.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.optim import Optimizer

from simkit.errors import SimkitError
from simkit.surgery.ops import attach_graft, insert_after, replace_module


class GraftLog:
    """An ordered list of mutation records."""

    def __init__(self, records: list[dict[str, Any]] | None = None) -> None:
        self.records: list[dict[str, Any]] = [copy.deepcopy(r) for r in records or []]

    def append(self, record: dict[str, Any]) -> None:
        try:
            json.dumps(record)
        except TypeError as exc:
            raise SimkitError(f"graft log records must be JSON-able ({exc})") from None
        self.records.append(copy.deepcopy(record))

    def to_list(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.records)

    def to_json(self) -> str:
        """The records as indented JSON text (write it with ``simkit.io.write_text``, atomically)."""
        return json.dumps(self.records, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> GraftLog:
        """The log written by :meth:`to_json`."""
        return cls(json.loads(text))

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.to_list())

    def replay(self, model: nn.Module, optimizer: Optimizer | None = None,
               modules: dict[int, nn.Module] | None = None) -> nn.Module:
        """Apply every record to ``model`` (in place) and return it.

        optimizer: grafts recorded with an optimizer add their parameters to it, in the same order.
        modules: record index → module, for records that used user modules.
        """
        modules = modules or {}
        for index, record in enumerate(self.records):
            op = record.get("op")
            if op == "graft":
                attach_graft(model, record, modules.get(index), optimizer)
            elif op in ("replace", "insert_after"):
                if index not in modules:
                    raise SimkitError(f"record {index} ({op} {record['name']!r}) used a user module "
                                      f"({record['module']}); pass replay(modules={{{index}: module}})")
                (replace_module if op == "replace" else insert_after)(model, record["name"], modules[index])
            else:
                raise SimkitError(f"record {index} has unknown op {op!r}; the log was not written by simkit")
        return model
