"""ConvertSettings (simkit.settings.convert): the names it chooses from match the torch registries, its
cross-field rules, and the record it writes (types kept, so inputs.json of old runs still match)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simkit.errors import SimkitError
from simkit.settings.convert import ALIGNMENT_METRICS, CELLS, ConvertSettings


def test_the_settings_tuples_match_the_registries_of_the_torch_modules():
    from simkit.conversion.context import LOSS_NAMES
    from simkit.conversion.modules import CELL_MODULES
    from simkit.metrics.losses import LOSSES

    assert tuple(CELL_MODULES) == CELLS
    assert tuple(LOSS_NAMES) == ALIGNMENT_METRICS
    assert set(LOSS_NAMES.values()) <= set(LOSSES)


def test_importing_the_settings_imports_no_torch():
    code = "import sys, simkit.settings.convert; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_plan_file_makes_the_recipe_none():
    assert ConvertSettings(plan="plan.py:make").validate().recipe is None
    assert ConvertSettings().validate().recipe == "conv-to-mlp"


def test_align_val_needs_a_validation_split():
    with pytest.raises(SimkitError, match="`align_val` adds the validation inputs"):
        ConvertSettings(align_val=True, val_fraction=0.0).validate()
    assert ConvertSettings(align_val=True).validate().align_val is True


@pytest.mark.parametrize("given, field, recorded", [
    ({"rank": "8"}, "rank", 8), ({"rank": 8}, "rank", 8), ({"rank": "64,256"}, "rank", [64, 256]),
    ({"rank": [8]}, "rank", [8]), ({"steps_per_stage": "3"}, "steps_per_stage", 3),
    ({"steps_per_stage": "auto"}, "steps_per_stage", "auto"), ({"stop_loss": "none"}, "stop_loss", None),
    ({"stop_loss": "0.01"}, "stop_loss", 0.01), ({"metric": ["cka", "linear_cka", "dmnn"]}, "metric",
                                                 ["linear_cka", "dmnn"]),
    ({"baselines": []}, "baselines", []), ({"finetune_epochs": 1}, "finetune_epochs", 1.0),
])
def test_values_are_normalised_and_recorded_with_their_json_type(given, field, recorded):
    settings = ConvertSettings(**given).validate()
    value = settings.to_dict()[field]
    assert value == recorded and type(value) is type(recorded)
    assert json.loads(json.dumps(settings.to_dict()))[field] == recorded


def test_resolved_says_what_auto_and_none_became():
    auto = ConvertSettings().validate().resolved()
    assert (auto["stop_loss"], auto["stage_steps"], auto["head_epochs"], auto["finetune_lr"]) == (0.002, 1000, 10.0,
                                                                                                  0.001)
    fixed = ConvertSettings(steps_per_stage=5, baselines=[]).validate().resolved()
    assert (fixed["stop_loss"], fixed["stage_steps"], fixed["finetune_epochs"]) == (None, 5, 60.0)
    assert ConvertSettings(rank="64,64,8").validate().ranks == [64, 8]
