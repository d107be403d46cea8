"""bench/gpu_check.sh runs every CUDA test in one stage, and that stage works before a GPU is lent.

The GPU checks are tests marked ``cuda`` (tests/test_cuda.py and the CUDA cases of other test files). On a
CPU they run in the ordinary suite, where tests/test_cuda.py's dry runs pass; here the stage's own command
is checked: it selects them, and without CUDA it skips only the tests that need it, each saying so.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"
CUDA_TESTS = ROOT / "tests" / "test_cuda.py"
HANG_GUARD = 300.0  # seconds; the stage's setup takes ~15 s here. Past it the run prints every thread's stack


def stages() -> dict[str, str]:
    """Name → command of each ``stage NAME SECONDS 'COMMAND'`` of gpu_check.sh, in the order they run."""
    return dict(re.findall(r"^stage (\w+) \d+ '(.*?)'$", SCRIPT.read_text(), re.M | re.S))


def cuda_tests() -> tuple[set[str], dict[str, int]]:
    """tests/test_cuda.py's test functions, and those marked ``needs_cuda`` with the line pytest reports
    them at (their first decorator's)."""
    functions = [
        node
        for node in ast.parse(CUDA_TESTS.read_text()).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    ]
    cuda_only = {
        node.name: min(decorator.lineno for decorator in node.decorator_list)
        for node in functions
        if any(ast.unparse(decorator) == "needs_cuda" for decorator in node.decorator_list)
    }
    return {node.name for node in functions}, cuda_only


def run_stage(command: str) -> tuple[int, str]:
    """Run a stage's command here; if it outlives the hang guard, SIGABRT makes faulthandler print where
    each thread is."""
    child = subprocess.Popen(
        ["bash", "-c", command],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGABRT)
        try:
            out, _ = child.communicate(timeout=30)
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        pytest.fail(f"{command} still running after {HANG_GUARD:.0f} s; its output:\n{out}")
    return child.returncode, out


def test_gpu_check_runs_the_cuda_tests_as_one_stage_between_the_install_and_the_benchmark() -> None:
    found = stages()
    assert list(found) == ["install", "cuda", "wan"]
    assert re.search(r"python3 -m pytest .*-m cuda ", found["cuda"]), found["cuda"]
    assert not list((ROOT / "bench").glob("*smoke*")), "the GPU checks are tests, not a bench script"


@pytest.mark.slow  # ~15 s: the stage's collection and setup (the tests themselves run in tests/test_cuda.py)
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA nothing is skipped: the stage runs as is")
def test_cuda_stage_on_a_cpu_selects_every_cuda_test_and_skips_only_what_needs_cuda() -> None:
    # --setup-only: every selected test is set up (its skip marks evaluated) but not run
    command = stages()["cuda"].replace("python3", shlex.quote(sys.executable), 1) + " --setup-only"

    code, out = run_stage(command)

    assert code == 0, out
    every, cuda_only = cuda_tests()
    set_up = set(re.findall(r"^\s+tests/test_cuda\.py::(\w+)", out, re.M))
    skipped = re.findall(r"^SKIPPED \[\d+\] (tests/\S+?):(\d+): (.*)$", out, re.M)
    assert cuda_only and set_up == every - set(cuda_only), out
    assert {int(line) for path, line, _ in skipped if path == "tests/test_cuda.py"} == set(cuda_only.values())
    assert {path for path, _, _ in skipped} - {"tests/test_cuda.py"}, "no CUDA case of another test file ran"
    assert all(re.match(r"needs (a )?CUDA", reason) for _, _, reason in skipped), skipped
