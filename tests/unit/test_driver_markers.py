"""A driver's marker directory: its own is new, and those of drivers that are gone (killed, never cleaned up) are
removed, while a live driver's is left alone."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from handoff_spark import app


def test_a_new_driver_removes_the_marker_directories_of_drivers_that_are_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid with no process behind it (as after a kill -9)
    live = subprocess.Popen(["sleep", "30"])
    try:
        dead_dir = tmp_path / f"{app.STOP_DIR_PREFIX}{gone.pid}-abc123"
        live_dir = tmp_path / f"{app.STOP_DIR_PREFIX}{live.pid}-def456"
        unrelated = tmp_path / f"{app.STOP_DIR_PREFIX}q1ewetur"  # an older driver's name, without a pid: kept
        for d in (dead_dir, live_dir, unrelated):
            d.mkdir()
        (dead_dir / "min-partitions").write_text("6")
        mine = Path(app.marker_dir())
        assert mine.parent == tmp_path and mine.name.startswith(f"{app.STOP_DIR_PREFIX}{os.getpid()}-")
        assert not dead_dir.exists() and live_dir.is_dir() and unrelated.is_dir() and mine.is_dir()
    finally:
        live.kill()
        live.wait()
