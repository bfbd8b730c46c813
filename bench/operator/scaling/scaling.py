"""Scaling on lag vs fixed executor counts, for a producer that steps its rate up 4× and back — a MODEL run.

What this measures: the operator's rule (`handoff_operator.scaling.rule.decide`, the code the operator runs) driving
a simple plant: Kafka receives `rate(t)` records/s, each executor processes `--per-executor` records/s, the
decision runs every `--refresh` seconds and an executor added by the decision starts processing
`--startup` seconds later (a stand-in for pod start + registration; removal is immediate). Same input, same
run: scaling on, fixed minExecutors, fixed maxExecutors. Reported: refreshes from the step to the first
scale-up decision, lag peak, seconds from the step up until the lag is 0 again (0: it never built up),
executor-seconds, executor changes.

What it does not measure: real pod start or executor registration times (that needs real nodes; the test
bed's kwok cannot run executors), or Spark's per-batch overhead. The figures compare the rule with the
fixed baselines under the same assumptions, nothing more.

    .venv/bin/python bench/operator/scaling/scaling.py [--base-rate 1000] [--per-executor 1000] [--refresh 10] [--startup 30]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))  # the operator imports the data plane's public face (contract)
sys.path.insert(0, str(ROOT / "operator"))

from handoff_operator.scaling.rule import ScalingInput, decide  # noqa: E402

PARTITIONS = 12


def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    step_up, step_down, end = 120, 720, 1800
    lo, hi = args.min_executors, args.max_executors
    desired = {"scaling": lo, "fixed-min": lo, "fixed-max": hi}[mode]
    ready_at: list[float] = [0.0] * desired           # when each executor starts processing
    lag, peak, history, last_scale = 0.0, 0.0, (), None
    first_up, drained_at, changes, executor_seconds = None, None, 0, 0.0
    end_offsets, prev_end, prev_t = 0.0, None, None
    t = 0
    while t < end:
        rate = args.base_rate * (4 if step_up <= t < step_down else 1)
        working = sum(1 for r in ready_at if r <= t)
        if mode == "scaling" and t % args.refresh == 0:
            input_rate = None if prev_end is None else (end_offsets - prev_end) / (t - prev_t)
            prev_end, prev_t = end_offsets, t
            d = decide(ScalingInput(
                now_ms=t * 1000, current=desired, min_executors=lo, max_executors=hi,
                target_catch_up_seconds=args.target_catch_up, cooldown_seconds=args.cooldown, cores_per_executor=2,
                lag={f"t/{p}": int(lag / PARTITIONS) for p in range(PARTITIONS)}, input_rate=input_rate,
                rate_per_executor=float(args.per_executor), trigger_seconds=10, last_scale_ms=last_scale,
                history=history))
            history = d.history
            if d.desired != desired:
                changes += 1
                if d.desired > desired:
                    if first_up is None and t >= step_up:
                        first_up = t
                    ready_at += [t + args.startup] * (d.desired - desired)
                else:
                    ready_at = sorted(ready_at)[:d.desired]
                desired, last_scale = d.desired, t * 1000
        end_offsets += rate
        lag = max(0.0, lag + rate - working * args.per_executor)
        peak = max(peak, lag)
        executor_seconds += len(ready_at)
        if t > step_up and drained_at is None and lag == 0 and peak > 0:
            drained_at = t
        t += 1
    return {"mode": mode, "refreshes_to_first_scale_up": (None if first_up is None
                                                          else (first_up - step_up) / args.refresh),
            "lag_peak": int(peak), "seconds_step_up_to_lag_0": (None if drained_at is None
                                                                 else drained_at - step_up),
            "executor_seconds": int(executor_seconds), "changes": changes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-rate", type=float, default=1000.0)
    ap.add_argument("--per-executor", type=float, default=1000.0)
    ap.add_argument("--refresh", type=int, default=10, help="status interval, seconds")
    ap.add_argument("--startup", type=int, default=30, help="seconds from a scale-up to a working executor")
    ap.add_argument("--min-executors", type=int, default=1)
    ap.add_argument("--max-executors", type=int, default=8)
    ap.add_argument("--target-catch-up", type=float, default=300.0)
    ap.add_argument("--cooldown", type=float, default=120.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scaling.json"))
    args = ap.parse_args()
    results = [run(mode, args) for mode in ("scaling", "fixed-min", "fixed-max")]
    cols = list(results[0])
    print(" | ".join(f"{c:>30}" if i else f"{c:<10}" for i, c in enumerate(cols)))
    for r in results:
        print(" | ".join(f"{str(r[c]):>30}" if i else f"{str(r[c]):<10}" for i, c in enumerate(cols)))
    Path(args.out).write_text(json.dumps({
        "bench": "scaling (model run: the decision rule over a simulated plant, see the docstring)",
        "args": vars(args), "python": platform.python_version(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
