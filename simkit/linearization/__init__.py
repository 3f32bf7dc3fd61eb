"""Post-training linearization and path-length statistics (spec §3, "ResNets are deeper than you think").

- :mod:`simkit.linearization.slope`: ``SlopeReLU`` (α = 0 is ReLU bit for bit), the penalty, the freeze rule;
- :mod:`simkit.linearization.prelu`: ``swap_relus`` — every ReLU call site becomes its own SlopeReLU;
- :mod:`simkit.linearization.napl`: ``path_lengths`` — NAPL, path-length distribution, unnormalised APL;
- :mod:`simkit.linearization.fold`: ``fold_linear_stretches`` — multiply out fully linear stretches;
- :mod:`simkit.settings.linearize`: ``LinearizeSettings`` — every option of a sweep (torch-free);
- :mod:`simkit.linearization.labels`: run labels and checkpoint names (ω written exactly);
- :mod:`simkit.linearization.aggregate`: mean ± spread over seeds per granularity × ω;
- :mod:`simkit.linearization.matched`: channel − layer accuracy at matched NAPL, per seed and over seeds;
- :mod:`simkit.linearization.runner`: ``linearize(model, data, settings)`` → ``LinearizeResult`` (kind "linearize").
"""

from simkit.linearization.fold import FoldResult, fold_linear_stretches
from simkit.linearization.matched import matched_napl, matched_over_seeds
from simkit.linearization.napl import PathLengths, path_lengths
from simkit.linearization.prelu import explicit_relus, swap_relus
from simkit.linearization.runner import LinearizeResult, linearize, post_train
from simkit.linearization.slope import FreezeRule, SlopeReLU, slope_penalty
from simkit.settings.linearize import LinearizeSettings

__all__ = [
    "FoldResult", "FreezeRule", "LinearizeResult", "LinearizeSettings", "PathLengths", "SlopeReLU",
    "explicit_relus", "fold_linear_stretches", "linearize", "matched_napl", "matched_over_seeds", "path_lengths",
    "post_train", "slope_penalty", "swap_relus",
]
