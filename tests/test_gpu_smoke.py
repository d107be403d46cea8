"""bench/gpu_smoke.py works before a GPU is lent: on this machine every check runs as a dry run and passes.

On a CPU each check reports SKIP after its dry run passed (OK on a CUDA machine); the script's exit status
says whether any check failed. Run as a subprocess, as on the device machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_smoke.py"


@pytest.mark.slow  # ~15 s: a dozen tiny decodes and sessions
def test_gpu_smoke_runs_every_check_and_passes() -> None:
    listed = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True, timeout=120
    )
    names = listed.stdout.split()
    assert {name.split(".")[0] for name in names} == {"chunks", "syncs", "wan", "stream_mp4", "codec"}

    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600)

    assert run.returncode == 0, run.stdout + run.stderr
    lines = re.findall(r"^(OK|SKIP|MISMATCH|FAIL) +(\S+) ", run.stdout, re.M)
    reported = {name: outcome for outcome, name in lines}
    assert list(reported) == names, run.stdout
    assert set(reported.values()) <= {"OK", "SKIP"}, run.stdout
    assert "\nsummary" in run.stdout
