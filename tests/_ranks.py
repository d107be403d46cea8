"""Real ranks for the distributed tests: processes joined with a deadline (a hang fails), and torchrun.

Importing torch and diffusers costs ~8 s a process on a 2-core CPU, more than most scenarios take, so
every launch is paid for once where it can be:

- :func:`spawn_ranks` forks each rank from the suite's forkserver (tests/_forkserver.py), which imported
  them once for the whole run: a rank is still a fresh process of its own (no thread, lock or process
  group of the test process comes with it), started in milliseconds instead of seconds.
- :func:`run_torchrun_jobs` runs several jobs (``-m streamvae decode …``, an example script) one after the
  other in one ``torchrun`` launch, whose ranks each import once. This file is the program those ranks run
  (``python -m tests._ranks JOBS.json``); each job's output and exit status are its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from tests._forkserver import context as rank_context  # tests start their ranks' events from it
from tests._forkserver import run_as_main
from tests._media import read_luma


def spawn_ranks(world: int, target: Callable[..., None], args: tuple[Any, ...], *, deadline_s: float) -> None:
    """Run ``target(rank, *args)`` in ``world`` new processes and wait for all of them.

    A rank still running ``deadline_s`` seconds after the start is killed and fails the test ("a rank
    hung"), as does a rank whose exit code is not 0. Forked from the suite's forkserver,
    never from the test process: torch's and the event loops' threads do not survive a fork.
    """
    context = rank_context()
    ranks = [context.Process(target=target, args=(rank, *args), daemon=True) for rank in range(world)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + deadline_s
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(ranks) if process.is_alive()]
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    if hung:
        pytest.fail(f"ranks {hung} of {world} still running after {deadline_s:.0f} s: a rank hung")
    codes = [process.exitcode for process in ranks]
    assert codes == [0] * world, f"rank exit codes {codes}"


# ------------------------------------------------------------------------------------------------ torchrun


@dataclass(frozen=True)
class TorchrunJob:
    """What one job of a torchrun launch left behind."""

    statuses: list[int | None]  # each rank's exit status, in rank order; None where it never finished
    stdout: str  # what the job printed, every rank's in rank order
    launch_status: int  # torchrun's own exit status: not 0 if any job failed on any rank
    launch_stderr: str  # every rank's stderr: a failing job's traceback, and which job it was

    def succeeded(self) -> bool:
        """Whether the job ended with status 0 on every rank and the launch as a whole exited 0."""
        return self.statuses == [0] * len(self.statuses) and self.launch_status == 0


@dataclass(frozen=True)
class Launches:
    """The jobs of one or more torchrun launches by name, and the folder the test's files are in."""

    folder: Path
    jobs: dict[str, TorchrunJob]


def run_torchrun_jobs(
    folder: Path, launches: list[dict[str, list[str]]], *, world: int = 2, timeout_s: float
) -> Launches:
    """Run each of ``launches`` as one ``torchrun --standalone`` launch of ``world`` ranks, its jobs in turn.

    A job is what follows ``torchrun …`` on a command line: ``["-m", MODULE, *args]`` or
    ``[SCRIPT, *args]``, run in each rank's process as ``python`` runs it (as ``__main__``), one torch
    thread a process. A job that destroys the default process group ends its launch: recreated in the same
    process, the group would be numbered from 0 again under keys its first life left in torchrun's store,
    and its ranks could connect to addresses that no longer listen. The first job that fails on a rank ends
    the launch too: the jobs after it report no status. A launch past ``timeout_s`` raises
    ``subprocess.TimeoutExpired`` (a hang guard). Each launch runs in a subfolder of ``folder``.
    """
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", f"--nproc-per-node={world}", "-m", "tests._ranks", "jobs.json"]
    results: dict[str, TorchrunJob] = {}
    for index, jobs in enumerate(launches):
        where = folder / f"launch{index}"
        where.mkdir()
        (where / "jobs.json").write_text(json.dumps(jobs))
        finished = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=where
        )
        for name in jobs:
            statuses = []
            for rank in range(world):
                status = where / f"{name}.rank{rank}.status"
                statuses.append(int(status.read_text()) if status.exists() else None)
            outputs = [where / f"{name}.rank{rank}.out" for rank in range(world)]
            stdout = "".join(output.read_text() for output in outputs if output.exists())
            results[name] = TorchrunJob(statuses, stdout, finished.returncode, finished.stderr)
    return Launches(folder, results)


def _run_jobs(spec: Path) -> int:
    """In each rank of :func:`run_torchrun_jobs`: run the jobs of ``spec``, each job's stdout into
    ``NAME.rankN.out`` and its exit status into ``NAME.rankN.status``; stop at the first that fails (its
    peers would otherwise wait for this rank in the next job's collectives)."""
    import torch.distributed as dist

    rank = os.environ["RANK"]
    jobs: dict[str, list[str]] = json.loads(spec.read_text())
    for index, (name, job) in enumerate(jobs.items()):
        with open(f"{name}.rank{rank}.out", "w") as stdout, contextlib.redirect_stdout(stdout):
            status = run_as_main(job)
        Path(f"{name}.rank{rank}.status").write_text(str(status))
        if status != 0:
            print(f"tests._ranks: job {name!r} exited with status {status} on rank {rank}", file=sys.stderr)
            return 1
        if index + 1 < len(jobs) and not dist.is_initialized():
            why = "destroyed the default process group: it must be the last job of its launch"
            print(f"tests._ranks: job {name!r} {why}", file=sys.stderr)
            return 1
    return 0


# -------------------------------------------------------------------------------------- streamvae decode


def save_decode_inputs(folder: Path, vae: Any, z: Tensor) -> None:
    """Save ``vae`` and ``z`` into ``folder``, where :func:`decode_arguments` reads them."""
    vae.save_pretrained(folder / "vae")
    torch.save(z, folder / "latents.pt")


def decode_arguments(folder: Path) -> list[str]:
    """``streamvae decode`` of what :func:`save_decode_inputs` saved into ``folder``: lossless x264
    (``--crf 0``) at 8 fps, quiet. The caller adds ``-o`` (and ``--shard``)."""
    inputs = ["decode", str(folder / "latents.pt"), "--vae", str(folder / "vae")]
    return [*inputs, "--fps", "8", "--crf", "0", "-q"]


def decode_alone(arguments: list[str], output: Path) -> np.ndarray:
    """``streamvae decode ARGUMENTS -o OUTPUT`` by the CLI's ``main`` in this process (one torch thread, as
    the suite runs): the luma of the MP4, [T, H, W] uint8. It must return 0 and report its output once."""
    from streamvae.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        status = main([*arguments, "-o", str(output)])
    assert status == 0
    assert stdout.getvalue().count(f"{output.name}:") == 1, stdout.getvalue()
    return read_luma(output.read_bytes())


def sharded_luma(job: TorchrunJob, output: Path) -> np.ndarray:
    """The luma of a sharded decode's MP4, [T, H, W] uint8, once the job ran on every rank and only the
    output rank reported writing it."""
    assert job.succeeded(), (job.statuses, job.launch_stderr[-4000:])
    assert job.stdout.count(f"{output.name}:") == 1, job.stdout
    return read_luma(output.read_bytes())


if __name__ == "__main__":
    sys.exit(_run_jobs(Path(sys.argv[1])))
