"""The exact-surgery verification suite on the built-in 4-block Llama-style model (d=128, 4 heads,
vocabulary 50), as in the paper: 600 SGD steps per E2 arm, a llama-style branch grafted after
blocks.1 with a shadow gate, F3 killed and resumed in a new process. E3 runs on a deeper built-in model
(8 blocks, the same width: 9 graft depths, ``e3_blocks``) so that its correlation of recompute time with
cone size rests on more than 5 points; the summary gives it with its 95 % interval (Fisher z) and judges
the paper's "bookkeeping ≈ 0.75 ms whatever the depth" by the slope of bookkeeping time against depth
with its 95 % interval (``e3_bookkeeping_*``; flat when the change over all depths is below a quarter of
the median).

    python examples/graft_suite.py [OUT_DIR]        # default: runs/graft_suite

Same as `simkit graft --steps 600 --e3-blocks 8 --out runs/graft_suite`. Prints the summary, the
verdict, the judged E3 numbers and the wall and CPU seconds of each check; open report.html. Timings
need an idle machine (E3 times the fastest of 5 calls per depth). Measured output:
examples/results/graft_suite.txt.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import simkit

E3_BLOCKS = 8  # E3's built-in model: 8 blocks, so 9 graft depths (embed and every block)


def main(out: Path) -> None:
    settings = simkit.GraftSettings(after="blocks.1", branch="llama", gate="shadow", steps=600, e3_blocks=E3_BLOCKS)
    result = simkit.graft(None, None, settings, run_dir=out)  # None, None: the built-in model and its tokens
    simkit.save_run(result, out)
    print(json.dumps(result.summary, indent=2))
    print(f"graft: {result.summary['verdict']}")
    summary = result.summary
    print(f"E3 over {summary['e3_sites']} depths: r = {summary['e3_cone_cost_correlation']:.4f} "
          f"[{summary['e3_cone_cost_correlation_low']:.4f}, {summary['e3_cone_cost_correlation_high']:.4f}] (95 %, "
          f"Fisher z; paper 0.9992)")
    print(f"bookkeeping: median {1e3 * summary['e3_bookkeeping_median_s']:.3f} ms, slope "
          f"{1e6 * summary['e3_bookkeeping_slope_s']:+.2f} µs/depth [{1e6 * summary['e3_bookkeeping_slope_low']:+.2f}, "
          f"{1e6 * summary['e3_bookkeeping_slope_high']:+.2f}] (95 %): {summary['e3_bookkeeping_verdict']} "
          "(paper: ≈ 0.75 ms whatever the depth)")
    print(f"wall s per check: {json.dumps({k: round(v, 1) for k, v in result.meta['timings'].items()})}")
    print(f"CPU s per check (with F3's workers): "
          f"{json.dumps({k: round(v, 1) for k, v in result.meta['cpu_seconds'].items()})}")
    print(f"report: {out / 'report.html'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=Path("runs/graft_suite"), help="run directory")
    main(parser.parse_args().out)
