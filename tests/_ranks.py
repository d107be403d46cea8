"""Real ranks for the distributed tests: spawned processes joined with a deadline, so a hang fails."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch.multiprocessing as mp


def spawn_ranks(world: int, target: Callable[..., None], args: tuple[Any, ...], *, deadline_s: float) -> None:
    """Run ``target(rank, *args)`` in ``world`` spawned processes and wait for all of them.

    A rank still running ``deadline_s`` seconds after the start is killed and fails the test ("a rank
    hung"), as does a rank whose exit code is not 0. Spawned (not forked): each imports torch afresh.
    """
    context = mp.get_context("spawn")
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
