"""``benchmarks/scale.py`` (cost as work grows): the report's shape, never its timings.

A tiny run on a SQLite file, driven as a user drives it (a subprocess): every size gets
its row with both latencies and the memory per live key, and the expired keys their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_scale_benchmark_reports_every_size_and_the_expired_keys() -> None:
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "scale.py"),
            "--sizes", "100,1000", "--samples", "50", "--backends", "sqlite",
            "--expired", "1000", "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    sizes = report["sizes"]
    assert [(row["backend"], row["live_keys"], row["samples"]) for row in sizes] == [
        ("sqlite", 100, 50),
        ("sqlite", 1000, 50),
    ]
    for row in sizes:
        for name in ("fresh_p50_ms", "fresh_p99_ms", "denied_p50_ms", "denied_p99_ms"):
            assert 0 < row[name] < 60_000, (name, row)
        assert row["fresh_p50_ms"] <= row["fresh_p99_ms"]
        assert row["denied_p50_ms"] <= row["denied_p99_ms"]
    assert sizes[0]["fresh_p99_x"] == sizes[0]["denied_p99_x"] == 1.0
    # A thousand rows take pages of their own: the store grew, by a plausible amount.
    assert 10 < sizes[1]["bytes_per_live_key"] < 10_000
    [expired] = report["expired"]
    assert expired["backend"] == "sqlite"
    assert expired["expired_keys"] == 1000
    assert 10 < expired["bytes_per_expired_key"] < 10_000
    # The table on stderr has one row per size.
    rows = [line.split() for line in done.stderr.splitlines() if line.startswith("sqlite ")]
    assert [row[1] for row in rows] == ["100", "1,000"]
