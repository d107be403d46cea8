"""The suite's one forkserver: processes that start with torch, diffusers and streamvae already imported.

Importing torch and diffusers costs ~3–8 s a process on a 2-core CPU, more than most of what the suite runs
in a process of its own takes: distributed ranks (tests/_ranks.py), the docs' ``python`` blocks
(tests/test_docs.py) and the example scripts (tests/test_examples.py). Each of them is forked from one
server that imported those modules once for the whole run: a process of its own (no thread, lock, event
loop or process group of the test process comes with it), started in milliseconds instead of seconds.
It is forked from the server, never from the test process: torch's and the event loops' threads do not
survive a fork.

Python has one forkserver a process (multiprocessing's), started by its first user, so its preload list is
one list, here: what any of its users imports.

:func:`run_main` is ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) in such a process: run as
``__main__`` with the ``sys.path``, environment, working directory and exit status a fresh interpreter
would have, its stdout and stderr its own.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import multiprocessing.context
import os
import runpy
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import torch.multiprocessing as mp

# What any of the server's users imports, imported once in the server (one list: the first user starts it).
PRELOAD = [
    "torch",
    "torch.distributed",
    "diffusers",
    "numpy",
    "av",
    "anyio",
    "streamvae",
    "streamvae.distributed",
    "tests._vaes",
    "tests._media",
]
#: the preloaded packages a script imports as installed; ``tests.*`` is the suite's own
_INSTALLED = sorted({name.split(".")[0] for name in PRELOAD} - {"tests"})


def context() -> multiprocessing.context.ForkServerContext:
    """The multiprocessing context whose processes fork from the server (for the events a test shares
    with them too)."""
    forkserver = mp.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)  # used when the server starts: the first call of the run
    return forkserver


def run_as_main(job: list[str]) -> int:
    """Run ``job`` (``-m MODULE ARGS`` or ``SCRIPT ARGS``) as ``__main__`` in this process, with ``job`` as
    ``sys.argv``; its exit status, as Python's: ``sys.exit``'s code, and 1 with the traceback on stderr
    for an uncaught exception."""
    try:
        if job[0] == "-m":
            sys.argv = job[1:]
            runpy.run_module(job[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(job)
            runpy.run_path(job[0], run_name="__main__")
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)  # SystemExit("message"): printed, status 1
        return 1
    except BaseException as error:
        trimmed = error.with_traceback(_from_the_script(error, job))
        sys.excepthook(type(trimmed), trimmed, trimmed.__traceback__)
        return 1
    return 0


def _from_the_script(error: BaseException, job: list[str]) -> TracebackType | None:
    """The traceback of ``error`` from the script's first frame on, as a fresh interpreter prints it: no
    runpy or helper frames above it, and none at all for a script that does not compile. A module run
    (``-m``) keeps them all, as ``python -m`` does."""
    frame = error.__traceback__
    if job[0] != "-m":
        while frame is not None and frame.tb_frame.f_code.co_filename != job[0]:
            frame = frame.tb_next
    return frame


# ------------------------------------------------------------------------------------------- run_main


@dataclass(frozen=True)
class Finished:
    """How a :func:`run_main` process ended, and what it wrote."""

    status: int | None  # its exit status; None: still running at the deadline, and killed
    stdout: str
    stderr: str


def run_main(job: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float) -> Finished:
    """``python JOB`` (``[SCRIPT, *ARGS]`` or ``["-m", MODULE, *ARGS]``) run in ``cwd`` with ``env``,
    in a process forked from the server.

    The process sees what a fresh interpreter started with ``env`` would: the same ``sys.path`` (the
    script's folder, or ``cwd`` for ``-m``, first; ``PYTHONPATH`` as ``env`` says) and ``os.environ``; its
    ``sys.exit`` code, or 1 and the traceback on stderr, is its exit status. A process still running after
    ``timeout_s`` seconds is killed (a hang guard). Its output goes to files, not pipes: a grandchild that
    keeps a pipe open can never hang the caller. Unlike a fresh interpreter's, its ``atexit`` functions do
    not run (multiprocessing ends a process with ``os._exit``): streamvae, the docs' blocks and the
    examples register none.
    """
    path = _fresh_sys_path(tuple(sorted(env.items())))
    first = str(cwd) if job[0] == "-m" else str((cwd / job[0]).resolve().parent)
    script = job if job[0] == "-m" else [str((cwd / job[0]).resolve()), *job[1:]]
    with tempfile.TemporaryDirectory() as folder:
        stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
        stdout.touch()  # there even for a process that fails before it opens them
        stderr.touch()
        process = context().Process(
            target=_main_of_a_process, args=(script, str(cwd), env, [first, *path], str(stdout), str(stderr))
        )
        process.start()
        try:
            process.join(timeout_s)
            status = process.exitcode  # None while it runs
        finally:
            if process.is_alive():  # past the deadline, or the test process interrupted
                process.kill()
                process.join()
        return Finished(status, stdout.read_text(errors="replace"), stderr.read_text(errors="replace"))


def _main_of_a_process(
    job: list[str], cwd: str, env: dict[str, str], path: list[str], stdout: str, stderr: str
) -> None:
    """In the forked process: become what ``python JOB`` in ``cwd`` with ``env`` would be, and run it."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = path
    for stream, name in ((sys.stdout, stdout), (sys.stderr, stderr)):
        stream.flush()
        with open(name, "ab") as file:
            os.dup2(file.fileno(), stream.fileno())  # the fd, so that C code and subprocesses write there too
    sys.exit(run_as_main(job))  # multiprocessing makes the code the process's exit status


@functools.cache
def _fresh_sys_path(env: tuple[tuple[str, str], ...]) -> list[str]:
    """The ``sys.path`` a fresh interpreter started with ``env`` has after its first entry (the script's
    folder), once it is checked that such an interpreter imports the preloaded packages from where the
    server did (the test process's ``sys.path``): a script forked from the server gets the server's."""
    probe = "import importlib.util, json, sys; names = json.loads(sys.argv[1])\n"
    probe += "print(json.dumps([sys.path, [importlib.util.find_spec(n).origin for n in names]]))"
    found = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(_INSTALLED)],
        env=dict(env), capture_output=True, text=True, check=True,
    )  # fmt: skip
    path, origins = json.loads(found.stdout)
    for name, origin in zip(_INSTALLED, origins, strict=True):
        spec = importlib.util.find_spec(name)
        preloaded = spec.origin if spec is not None else None
        why = f"a fresh interpreter imports {name} from {origin}, the forkserver from {preloaded}"
        assert origin == preloaded, why
    return list(path[1:])
