"""simkit: how similar are two neural networks inside, layer by layer.

Library entry points (each returns a result with ``.to_frame()``, ``.save(dir)``, ``.report(path)``):
``compare`` (CKA family, mutual k-NN), ``load`` (read a run directory back).
"""

from __future__ import annotations

__version__ = "0.1.0"

from simkit.errors import SimkitError
from simkit.results import load

__all__ = ["SimkitError", "__version__", "compare", "load"]


def __getattr__(name: str):
    # Heavy modules load on first use so `import simkit` and `simkit --help` stay fast.
    if name == "compare":
        from simkit.comparison import compare

        return compare
    raise AttributeError(f"module 'simkit' has no attribute {name!r}")
