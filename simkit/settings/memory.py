"""The memory budget of the stored measures: ``auto`` (a share of the memory this machine has free) or a size.

``CompareSettings.memory_budget_bytes`` (``--memory-budget``) takes ``auto`` (the default), a number of
bytes, or a number with a binary suffix: ``512M``, ``4G``, ``1.5T`` (K, M, G, T: powers of 1024; a trailing
``B`` or ``iB`` is allowed, ``4GiB``). :func:`memory_budget` turns it into bytes when the accumulator is
made: ``auto`` is :data:`AUTO_FRACTION` of the memory available now (``MemAvailable`` of ``/proc/meminfo``),
or :data:`FALLBACK_BUDGET` where that cannot be read (a system without ``/proc``), which it says in
:func:`budget_source`. The recorded setting stays ``auto``, so a resumed run on a busier machine is the
same run. Torch-free: the command line reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simkit.options import Constraint, is_integer

#: the share of the available memory that ``auto`` gives the stored measures
AUTO_FRACTION = 0.5
#: the budget of ``auto`` where the available memory cannot be read (the fixed budget of earlier versions)
FALLBACK_BUDGET = 2**30
#: where the available memory is read (Linux)
MEMINFO = Path("/proc/meminfo")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def available_memory_bytes() -> int | None:
    """The memory the kernel says a new process can use without swapping (``MemAvailable``), in bytes;
    None where it cannot be read."""
    try:
        text = MEMINFO.read_text(encoding="ascii")
    except OSError:
        return None
    found = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def memory_budget(value: int | str) -> int:
    """The budget in bytes of a validated ``memory_budget_bytes``: its bytes, or for ``auto``
    :data:`AUTO_FRACTION` of :func:`available_memory_bytes` (:data:`FALLBACK_BUDGET` if unreadable)."""
    if value != "auto":
        return int(value)
    available = available_memory_bytes()
    return FALLBACK_BUDGET if available is None else max(1, int(AUTO_FRACTION * available))


def budget_source(value: int | str) -> str:
    """Where the budget of ``memory_budget_bytes`` = ``value`` comes from, in words (for ``describe()``)."""
    if value != "auto":
        return "given"
    if available_memory_bytes() is None:
        return f"auto: the available memory could not be read, fixed {FALLBACK_BUDGET // 2**20} MiB"
    return f"auto: {AUTO_FRACTION:.0%} of the available memory"


def parse_size(value: Any) -> int | None:
    """Bytes of ``value``: a positive integer, or a text ``"4G"``, ``"512M"``, ``"1.5GiB"``, ``"1048576"``
    (binary suffixes); None when it is neither."""
    if is_integer(value):
        return int(value) if value >= 1 else None
    if not isinstance(value, str):
        return None
    found = _SIZE.match(value)
    if found is None:
        return None
    size = int(float(found.group(1)) * _UNITS[found.group(2).upper()])
    return size if size >= 1 else None


@dataclass(frozen=True)
class ByteSize(Constraint):
    """``auto`` or a size in bytes (:func:`parse_size`), normalised to ``"auto"`` or an int."""

    def check(self, value: Any, name: str) -> int | str:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        size = parse_size(value)
        if size is None:
            raise self.refuse(value, name)
        return size

    def describe(self) -> str:
        return ("'auto' or a size in bytes: a positive integer, or a number with K, M, G or T "
                "(powers of 1024), e.g. 4G or 512M")

    def invalid(self) -> Any:
        return "lots"

    def cli_type(self) -> Any:
        return str
