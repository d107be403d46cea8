"""Helpers shared by the command-line tests: the one-line error a refused command prints, and
``streamvae demo`` run in a fresh interpreter and stopped by a signal mid-decode (Ctrl-C's SIGINT, a service
manager's SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Runs the command as ``python -m streamvae`` would, with Ctrl-C's handler as the parent left it: Python's
# own (even where the test runner's parent ignores SIGINT: a background job's children inherit that), or
# ignored (a background job's, which SIGTERM must not need).
_RUN_STREAMVAE = """
import runpy, signal, sys
ignore, *argv = sys.argv[1:]
signal.signal(signal.SIGINT, signal.SIG_IGN if ignore == "1" else signal.default_int_handler)
sys.argv = ["streamvae", *argv]
runpy.run_module("streamvae", run_name="__main__")
"""


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed to stderr: exactly one line, ``streamvae: error: ...``."""
    err = capsys.readouterr().err
    assert err.startswith("streamvae: error: ") and err.count("\n") == 1, err
    return err


def streamvae_command(*argv: str, sigint_ignored: bool = False) -> list[str]:
    """The command that runs ``streamvae *argv`` in a fresh interpreter, SIGINT ignored or Python's own."""
    return [sys.executable, "-c", _RUN_STREAMVAE, "1" if sigint_ignored else "0", *argv]


def check_signal_mid_decode(
    tmp_path: Path,
    backend: str,
    signum: signal.Signals,
    *,
    status: int,
    said: str,
    sigint_ignored: bool = False,
) -> None:
    """``streamvae demo -o x.mp4`` over an earlier render, sent ``signum`` once its first fragment is on disk
    (a decode of minutes, long before it ends): it exits ``status`` with the one line ``said`` on stderr,
    nothing on stdout, and leaves the earlier file as it was, no ``.part`` beside it."""
    output = tmp_path / "x.mp4"
    output.write_bytes(b"an earlier render")
    part = tmp_path / "x.mp4.part"
    argv = ["-o", str(output), "--frames", "257", "--size", "256", "--backend", backend, "-q"]
    command = streamvae_command("demo", *argv, sigint_ignored=sigint_ignored)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a hang guard only
        # The child's only sign of progress is its file: poll for it (there is nothing to wait on).
        while not (part.exists() and part.stat().st_size > 0):
            assert process.poll() is None, process.communicate(timeout=60)  # a pipe held open: fails
            assert time.monotonic() < deadline, "the decode never wrote its first fragment"
            time.sleep(0.02)
        process.send_signal(signum)
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)  # not communicate(): a grandchild holding its pipes would hang it
        for pipe in (process.stdout, process.stderr):
            assert pipe is not None
            pipe.close()
    assert process.returncode == status, err[-4000:]
    assert err == said and out == ""
    assert os.listdir(tmp_path) == ["x.mp4"]  # no .part left
    assert output.read_bytes() == b"an earlier render"
