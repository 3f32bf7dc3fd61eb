"""The only code that mutates models: replace, insert, graft gated residual blocks, optimizer
continuity, bit-exact checks, the graft log and graft locality (spec §4).

Pure mutation: modules here import nothing but torch, the standard library, ``simkit.errors`` and the
torch-free names of gates and branches (``simkit.settings.graft``: declared once, with the settings
that check them) (no training, data, models or results). Train/eval modes and seeds are the caller's: pass seeds and
probe batches in, and run grafts under ``simkit.forward.eval_mode`` for eval-mode probes. The
exact-surgery verification suite (``simkit graft``) that trains grafted models is
:mod:`simkit.grafting`.
"""

from simkit.surgery.branches import BRANCHES, ConvBranch, GatedResidual, MLPBranch, build_branch
from simkit.surgery.cone import (
    CachedRunner,
    downstream_cone,
    find_node,
    graph_target,
    keep_original_targets,
    original_target,
    printable_name,
    trace,
)
from simkit.surgery.exact import bit_mismatches, negative_zeros, preconditions
from simkit.surgery.log import GraftLog
from simkit.surgery.ops import Graft, get_module, graft_gated_residual, insert_after, replace_module
from simkit.surgery.optim import add_new_params

__all__ = [
    "BRANCHES", "CachedRunner", "ConvBranch", "GatedResidual", "Graft", "GraftLog", "MLPBranch",
    "add_new_params", "bit_mismatches", "build_branch", "downstream_cone", "find_node", "get_module", "graph_target", "keep_original_targets",
    "graft_gated_residual", "insert_after", "negative_zeros", "original_target", "preconditions", "printable_name",
    "replace_module", "trace",
]
