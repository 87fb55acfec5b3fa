"""Runs `benchmarks.compat.child` in a fresh interpreter (the libraries' module names collide)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_child(args: list[str], timeout_s: float) -> str | None:
    """None on success, else the reason (the child's last stderr lines, or the timeout)."""
    cmd = [sys.executable, "-m", "benchmarks.compat.child", *args]
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s"
    if done.returncode == 0:
        return None
    tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-6:]
    return "\n".join(tail) or f"exit status {done.returncode}"
