"""Runs `benchmarks.compat.child` in a fresh interpreter (the libraries' module names collide)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_child(args: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str | None:
    """None on success, else the reason (the child's last stderr lines, or the timeout); `env`:
    variables set for the child on top of this process's."""
    cmd = [sys.executable, "-m", "benchmarks.compat.child", *args]
    child_env = None if env is None else {**os.environ, **env}
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=child_env)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s"
    if done.returncode == 0:
        return None
    tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-6:]
    return "\n".join(tail) or f"exit status {done.returncode}"
