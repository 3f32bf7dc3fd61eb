"""Model specs → modules (:func:`load_model`, :func:`save_model`) and the built-in small-model zoo.

See :mod:`simkit.models.loading` for the spec grammar and :mod:`simkit.models.small` for the zoo's
module names.
"""

from simkit.models.loading import HFModel, load_model, load_weights, save_model, seeded_model_factory
from simkit.models.zoo import ZOO

__all__ = ["HFModel", "ZOO", "load_model", "load_weights", "save_model", "seeded_model_factory"]
