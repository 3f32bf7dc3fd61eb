"""Named phases of a run where a test can stop the process (``SIMKIT_KILL_AT``), to check what a kill
leaves behind.

``phase("writing")`` does nothing unless the environment names that phase: ``SIMKIT_KILL_AT=writing``
sends the process ``SIGKILL`` there (``SIMKIT_KILL_SIGNAL=TERM`` or ``INT`` for the other signals a user
sends). The phases (docs/long-runs.md): ``loading`` (a compare's models and data loaded),
``streaming`` (the first batch fed), ``computing`` (every batch fed; values and chance levels next),
``writing`` (result files staged, not yet committed), ``rendering`` (the report being written),
``capturing`` (a cache's shard written, its manifest not yet). ``tests/reliability/test_kill_phases.py`` kills compare, capture, study and a report render at
each and checks the directory.
"""

from __future__ import annotations

import os
import signal

KILL_AT = "SIMKIT_KILL_AT"
KILL_SIGNAL = "SIMKIT_KILL_SIGNAL"


def phase(name: str) -> None:
    """Stop this process here when ``SIMKIT_KILL_AT`` names phase ``name`` (a test hook; a no-op otherwise)."""
    if os.environ.get(KILL_AT) != name:
        return
    which = os.environ.get(KILL_SIGNAL, "KILL").upper()
    os.kill(os.getpid(), getattr(signal, f"SIG{which}", signal.SIGKILL))
