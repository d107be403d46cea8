"""bench/gpu_smoke.py works before a GPU is lent: on this machine every check runs as a dry run and passes.

On a CPU each check reports SKIP after its dry run passed (OK on a CUDA machine); the script's exit status
says whether any check failed. Run as a subprocess, as on the device machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_smoke.py"
HANG_GUARD = 300.0  # seconds; the smoke takes ~20 s here. Past it the script prints every thread's stack


def run_smoke() -> tuple[int, str]:
    """Run the smoke; if it outlives the hang guard, SIGABRT makes faulthandler print where each thread is."""
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        out, _ = child.communicate(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)
        try:
            out, _ = child.communicate(timeout=30)
        finally:
            child.kill()
            child.wait()
        pytest.fail(f"bench/gpu_smoke.py still running after {HANG_GUARD:.0f} s; its output:\n{out}")
    return child.returncode, out


@pytest.mark.slow  # ~15 s: a dozen tiny decodes and sessions
def test_gpu_smoke_runs_every_check_and_passes() -> None:
    listed = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True, timeout=120
    )
    names = listed.stdout.split()
    families = {"chunks", "syncs", "sharded", "wan", "stream_mp4", "codec"}
    assert {name.split(".")[0] for name in names} == families

    code, out = run_smoke()

    assert code == 0, out
    lines = re.findall(r"^(OK|SKIP|MISMATCH|FAIL) +(\S+) ", out, re.M)
    reported = {name: outcome for outcome, name in lines}
    assert list(reported) == names, out
    assert set(reported.values()) <= {"OK", "SKIP"}, out
    assert "\nsummary" in out
