"""Post-training linearization and path-length statistics (spec §3, "ResNets are deeper than you think").

- :mod:`simkit.linearization.prelu`: ``SlopeReLU`` (α = 0 is ReLU bit for bit), ``swap_relus``, the freeze rule;
- :mod:`simkit.linearization.napl`: ``path_lengths`` — NAPL, path-length distribution, unnormalised APL;
- :mod:`simkit.linearization.fold`: ``fold_linear_stretches`` — multiply out fully linear stretches;
- :mod:`simkit.linearization.runner`: ``run_linearization`` → ``LinearizeResult`` (kind "linearize").
"""

from simkit.linearization.fold import FoldResult, fold_linear_stretches
from simkit.linearization.napl import PathLengths, path_lengths
from simkit.linearization.prelu import FreezeRule, SlopeReLU, explicit_relus, slope_penalty, swap_relus
from simkit.linearization.runner import LinearizeResult, matched_napl, post_train, run_linearization

__all__ = [
    "FoldResult", "FreezeRule", "LinearizeResult", "PathLengths", "SlopeReLU", "explicit_relus",
    "fold_linear_stretches", "matched_napl", "path_lengths", "post_train", "run_linearization",
    "slope_penalty", "swap_relus",
]
