"""Names of a sweep's runs: ω as exact text, run labels for tables and reports, checkpoint stage names."""

from __future__ import annotations


def omega_text(omega: float) -> str:
    """ω as text that names exactly one float: ``%g`` when that reads back as the same value (0.001,
    1e-05, 1), else the shortest exact form (``repr``: 1.0000001e-4 → "0.00010000001"); "+" dropped.

    Distinct floats always get distinct texts (each text parses back to its own value), so two ω of a
    sweep that agree to 6 significant digits never share a run label or a checkpoint.
    """
    omega = float(omega) + 0.0  # -0.0 → 0.0
    short = f"{omega:g}"
    return (short if float(short) == omega else repr(omega)).replace("+", "")


def run_label(granularity: str, omega: float, seed: int | None = None) -> str:
    """The run's name in every table and the report: ``"channel ω=0.001"`` (ω as :func:`omega_text`),
    ``"channel ω=0.001 seed=1"`` when the sweep runs several seeds (``seed`` given)."""
    label = f"{granularity} ω={omega_text(omega)}"
    return label if seed is None else f"{label} seed={seed}"


def stage_name(granularity: str, omega: float, seed: int | None = None) -> str:
    """Checkpoint name of one run: ``linearize_channel_w0.001`` (unchanged for ω that ``%g`` spells
    exactly, so older run directories still resume; exact text otherwise, see :func:`omega_text`),
    ``linearize_channel_w0.001_s1`` when the sweep runs several seeds (``seed`` given)."""
    name = f"linearize_{granularity}_w{omega_text(omega)}"
    return name if seed is None else f"{name}_s{seed}"


__all__ = ["omega_text", "run_label", "stage_name"]
