"""LinearizeSettings: declared once (simkit.settings.linearize), validated by the generic mechanism into a
normalised frozen copy, recorded as before, and importable without torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from simkit.errors import SimkitError
from simkit.settings.linearize import DEFAULT_OMEGAS, GRANULARITIES, LinearizeSettings

# the record of the default settings (inputs.json / meta.settings): its keys, values and JSON types
DEFAULT_RECORD = {
    "granularity": ["channel", "layer"], "omega": [1e-4, 1e-3, 1e-2, 1e-1], "epochs": 5.0, "train": 0.0,
    "lr": 1e-3, "slope_lr": 1e-2, "batch_size": 128, "fold": False, "cka": True, "seed": 0, "seeds": 1,
    "eps": 1e-3, "freeze_tol": 0.01, "cka_samples": 512, "recover": 0.0, "recover_shape": False,
    "recover_val_fraction": 0.0, "napl_threshold": 0.0,
}


def test_the_default_record_keeps_its_keys_values_and_types():
    record = LinearizeSettings().validate().to_dict()
    assert list(record) == list(DEFAULT_RECORD)
    assert record == DEFAULT_RECORD
    assert [type(v) for v in record.values()] == [type(v) for v in DEFAULT_RECORD.values()]


def test_validate_returns_a_normalised_copy_and_leaves_the_original():
    given = LinearizeSettings(granularity=("layer",), omega=(1, "0.5"), epochs=2, train=1)
    checked = given.validate()
    assert checked is not given and checked.is_validated and not given.is_validated
    assert checked.to_dict()["omega"] == [1.0, 0.5] and checked.to_dict()["granularity"] == ["layer"]
    assert [type(checked.epochs), type(checked.train)] == [float, float]
    assert given.omega == (1, "0.5")
    assert checked.validate() is checked   # the rules run once


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LinearizeSettings().epochs = 2.0  # type: ignore[misc]


def test_granularities_and_omegas_run_each_value_once_in_order():
    s = LinearizeSettings(granularity=["layer", "channel", "layer"], omega=[1e-2, -0.0, 0.0, 1e-2, 1e-3]).validate()
    assert s.granularities() == ["layer", "channel"]
    assert s.omegas() == [1e-2, 0.0, 1e-3]
    assert str(s.omegas()[1]) == "0.0"   # -0.0 is read as 0.0
    assert s.to_dict()["omega"] == [1e-2, -0.0, 0.0, 1e-2, 1e-3]   # the record keeps the list as given


@pytest.mark.parametrize("changes, message", [
    ({"omega": [1e-2, -1]}, r"`omega` must be a non-empty list of values, each a number >= 0, got \[0.01, -1\]"),
    ({"omega": 0.1}, "`omega` must be a non-empty list"),
    ({"omega": []}, "`omega` must be a non-empty list"),
    ({"granularity": ["chanel"]}, "unknown granularity 'chanel'; closest: channel"),
    ({"granularity": []}, "`granularity` is empty"),
    ({"epochs": 0}, "`epochs` must be a number > 0, got 0"),
    ({"lr": float("nan")}, "`lr` must be a number > 0"),
    ({"eps": -1e-3}, "`eps` must be a number >= 0"),
    ({"cka_samples": 0}, "`cka_samples` must be a positive integer, got 0"),
    ({"batch_size": True}, "`batch_size` must be a positive integer, got True"),
    ({"cka": "yes"}, "`cka` must be true or false"),
    ({"seed": 1.5}, "`seed` must be an integer, got 1.5"),
])
def test_bad_settings_name_the_argument(changes, message):
    with pytest.raises(SimkitError, match=message):
        LinearizeSettings(**changes).validate()


def test_the_choice_tuples_live_in_the_settings_module():
    from simkit.linearization import prelu, slope

    assert prelu.GRANULARITIES is GRANULARITIES
    assert slope.FREEZE_TOL == LinearizeSettings().freeze_tol
    assert LinearizeSettings().omega == list(DEFAULT_OMEGAS)


def test_the_settings_module_does_not_import_torch():
    code = "import sys, simkit.settings.linearize; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
