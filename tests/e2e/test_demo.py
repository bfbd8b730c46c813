"""`make demo`'s script, as a newcomer runs it (smaller): data through Spark (transform, dedupe, event time), a
kill -9 survived, a RollbackAndReplay performed with the transform, offsets visible; every check it prints is ok.

The demo is one of the README's two commands, and its RollbackAndReplay is the one drill where a replay runs
through a transform and a dedupe (issue 31's "a replay with a transform"): this keeps both true."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]

CHECKS = (
    "every valid record is in the table",
    "no record twice (distinct offsets == rows)",
    "no order twice",
    "malformed and late records in the dead-letter topic",
    "test orders filtered and re-sent ids dropped, counted in the ledger",
    "every batch committed by Spark's query (none by the driver itself)",
    "ledger ends at Kafka's end offsets",
    "group offsets == ledger (committed after the table)",
    "graceful stop exited 0",
    "replay: rolled back, then the table is whole again (same rows, none twice)",
)


def test_the_demo_runs_through_spark_a_kill9_and_a_replay_with_every_check_ok() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "hack" / "demo.py"), "--records", "4000"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    for check in CHECKS:
        assert f"[ok] {check}" in out, (check, out[-4000:])
    assert "[FAILED]" not in out
    assert "Through Spark, exactly once, through a kill -9 and a replay." in out
    assert "replay | " in out  # the ReplayRequest's plan and steps, printed by `handoff replay`
