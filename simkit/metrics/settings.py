"""The settings of a comparison (:class:`CompareSettings`, declared in ``simkit.settings.compare``) under
the names the metrics and the engine use: ``MeasureSettings`` (the measures' own settings), and
:func:`check_setting` for the one-shot functions' keywords."""

from simkit.settings.compare import (
    DEFAULT_METRICS,
    MODES,
    CompareSettings,
    MeasureSettings,
    check_metrics,
    check_setting,
    resolve_settings,
)

__all__ = ["DEFAULT_METRICS", "MODES", "CompareSettings", "MeasureSettings", "check_metrics", "check_setting",
           "resolve_settings"]
