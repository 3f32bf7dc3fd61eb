"""simkit.conversion: Network of Theseus conversion (``simkit convert``).

``convert(guide, data, ConvertSettings(...), plan=None, run_dir=None, resume=False)`` → ConvertResult
(``guide``: a module, or a factory ``seed -> module`` for ``ConvertSettings(seeds=N)``);
``load_plan_file("file.py:make_plan", guide)`` → the ReplacementPlan of a plan file (runs its code).
"""

from simkit.conversion.plans import Replacement, ReplacementPlan, Slot
from simkit.conversion.recipes import load_plan_file
from simkit.conversion.runner import convert
from simkit.settings.convert import BASELINES, GUIDE_INITS, RECIPES, SCHEDULES, ConvertSettings

__all__ = ["BASELINES", "GUIDE_INITS", "RECIPES", "SCHEDULES", "ConvertSettings", "Replacement",
           "ReplacementPlan", "Slot", "convert", "load_plan_file"]
