"""The exact-surgery verification suite on the built-in 4-block Llama-style model (d=128, 4 heads,
vocabulary 50), as in the paper: 600 SGD steps per E2 arm, a llama-style branch grafted after
blocks.1 with a shadow gate, F3 killed and resumed in a new process.

    python examples/graft_suite.py [OUT_DIR]        # default: runs/graft_suite

Same as `simkit graft --steps 600 --out runs/graft_suite`. Prints the summary, the verdict and the
wall and CPU seconds of each check; open report.html. Measured output: examples/results/graft_suite.txt.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import simkit


def main(out: Path) -> None:
    settings = simkit.GraftSettings(after="blocks.1", branch="llama", gate="shadow", steps=600)
    result = simkit.graft(None, None, settings, run_dir=out)  # None, None: the built-in model and its tokens
    simkit.save_run(result, out)
    print(json.dumps(result.summary, indent=2))
    print(f"graft: {result.summary['verdict']}")
    print(f"wall s per check: {json.dumps({k: round(v, 1) for k, v in result.meta['timings'].items()})}")
    print(f"CPU s per check (with F3's workers): "
          f"{json.dumps({k: round(v, 1) for k, v in result.meta['cpu_seconds'].items()})}")
    print(f"report: {out / 'report.html'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=Path("runs/graft_suite"), help="run directory")
    main(parser.parse_args().out)
