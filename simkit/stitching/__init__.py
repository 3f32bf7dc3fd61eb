"""Model stitching, standard and invariance-aware (spec §2).

- :mod:`simkit.settings.stitch`: :class:`StitchSettings` and :class:`IRISettings`, every option that changes
  results (torch-free, re-exported here);
- :mod:`~simkit.stitching.stitch_layer`: stitch layers (1×1 conv / linear) and their least-squares fit;
- :mod:`~simkit.stitching.halves`: A's front half and B's back half (a real fx cut) on frozen copies;
- :mod:`~simkit.stitching.objectives`: HLM, SLM, DM and FuLA losses;
- :mod:`~simkit.stitching.stitched`: the stitched model and the per-objective training loss;
- :mod:`~simkit.stitching.iri`: identically represented inputs, cached as safetensors;
- :mod:`~simkit.stitching.pairs`: layer pairs (lists or ``auto`` by relative depth);
- :mod:`~simkit.stitching.runner`: ``stitch(model_a, model_b, data, settings)`` → :class:`StitchResult`.
"""

from simkit.results import StitchResult
from simkit.settings.stitch import OBJECTIVES, IRISettings, StitchSettings
from simkit.stitching.iri import IRISet, generate_iris
from simkit.stitching.objectives import dm_loss, fula_loss, hlm_loss, slm_loss
from simkit.stitching.runner import stitch
from simkit.stitching.stitch_layer import LeastSquares, StitchLayer

__all__ = ["OBJECTIVES", "IRISet", "IRISettings", "LeastSquares", "StitchLayer", "StitchResult", "StitchSettings",
           "dm_loss", "fula_loss", "generate_iris", "hlm_loss", "slm_loss", "stitch"]
