"""Entry point of the `simkit` command: imports every command module, then runs the app."""

from __future__ import annotations

import sys

from simkit.cli import (  # noqa: F401  (each module registers its commands on the app)
    capture,
    compare,
    convert,
    graft,
    layers,
    linearize,
    napl,
    report,
    stitch,
    trend,
)
from simkit.cli.common import app


def main() -> None:
    """Run the `simkit` app; an uncaught exception prints its traceback and one line, exit code 1."""
    try:
        app()
    except Exception as exc:  # an internal error: say so briefly, exit 1
        import traceback

        traceback.print_exc()
        print(f"simkit: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
