"""The default graft suite (``simkit graft`` with its defaults: the built-in 4-block model, 600 steps)
as a process: wall time, CPU seconds (its own and its worker processes', from ``os.wait4``), load.

    .venv/bin/python benchmarks/bench_graft.py                     # appends to benchmarks/results/bench_graft.txt
    .venv/bin/python benchmarks/bench_graft.py --steps 40 --results /tmp/bench_graft.txt

Target (issue #17): under 5 minutes of wall time on 2 cores with every check holding. The suite's
own per-phase wall and CPU seconds (``meta.timings``, ``meta.cpu_seconds`` of its result.json) are
appended too. On a shared machine the wall time is stretched by the others' load; the CPU seconds
are what this run itself used, so compare those between runs on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

TARGET_S = 300.0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def run(steps: int | None, out: Path) -> dict:
    """Run the suite once; wall seconds, CPU seconds of the process tree, exit code, stdout's verdict."""
    cmd = [sys.executable, "-m", "simkit.cli.main", "graft", "--out", str(out), "--no-report"]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    load_before, start = load(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # os.wait4 gives the child's rusage, which includes the workers it waited for
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stdout = proc.stdout.read() if proc.stdout is not None else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"cmd": " ".join(["simkit", *cmd[3:]]), "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "rc": proc.returncode,
            "verdict": next((line for line in stdout.splitlines() if line.startswith("graft:")), stdout[-300:]),
            "load_before": load_before, "load_after": load()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="--steps of the suite (default: its own, 600)")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "bench_graft.txt")
    parser.add_argument("--note", default="", help="one line appended under the heading")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-graft-"))
    try:
        r = run(args.steps, scratch / "run")
        result = json.loads((scratch / "run" / "result.json").read_text()) if r["rc"] == 0 else {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    meta = result.get("meta", {})
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  {cpu_model()}, {os.cpu_count()} cores  "
             f"load average {r['load_before']} before, {r['load_after']} after",
             *( [args.note] if args.note else []),
             f"  {r['cmd']}  (steps {args.steps or 600}, threads {meta.get('settings', {}).get('threads')})",
             f"  wall {r['wall_s']:.1f} s (target < {TARGET_S:.0f} s: {'met' if r['wall_s'] < TARGET_S else 'missed'})"
             f"   CPU {r['cpu_s']:.1f} s (user {r['user_s']:.1f}, sys {r['sys_s']:.1f}; process and workers)"
             f"   exit {r['rc']}",
             f"  {r['verdict']}"]
    if meta:
        wall = ", ".join(f"{k} {v:.1f}" for k, v in meta.get("timings", {}).items())
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in meta.get("cpu_seconds", {}).items())
        lines += [f"  phases, wall s: {wall}", f"  phases, CPU s (with waited workers): {cpu}"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a", encoding="utf-8") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
