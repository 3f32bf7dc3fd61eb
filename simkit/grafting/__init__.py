"""``simkit graft`` as a library: the exact-surgery paper's verification suite (E1 bit mismatches of a
graft, E2 the three gate arms under SGD, E3 recompute cost against cone size, F3 a grafted run killed
and resumed in a new process) on any model. The mutations themselves are :mod:`simkit.surgery`."""

from simkit.grafting.runner import graft
from simkit.settings.graft import BUILTIN, GraftSettings

__all__ = ["BUILTIN", "GraftSettings", "graft"]
