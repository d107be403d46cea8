"""Real ranks for the distributed tests: spawned processes joined with a deadline (a hang fails), torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import Tensor

from tests._media import read_luma


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


def decode_with_the_cli_sharded_and_alone(
    folder: Path, vae: Any, z: Tensor, shard: str, *, timeout_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """``streamvae decode`` of ``z`` with ``vae`` (both saved into ``folder``) under ``torchrun`` on 2 ranks
    with ``--shard shard``, and in one process: the luma of each MP4, [T, H, W] uint8, sharded first.

    Lossless x264 (``--crf 0``), one torch thread a process. Each run must exit 0 and report its output
    once: only the output rank of the sharded run writes and reports.
    """
    vae.save_pretrained(folder / "vae")
    torch.save(z, folder / "latents.pt")
    common = ["latents.pt", "--vae", "vae", "--fps", "8", "--crf", "0", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    commands = {
        "sharded": [str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "streamvae", "decode"],
        "single": [sys.executable, "-m", "streamvae", "decode"],
    }
    lumas = []
    for name, command in commands.items():
        extra = ["--shard", shard] if name == "sharded" else []
        finished = subprocess.run(
            [*command, *common, "-o", f"{name}.mp4", *extra],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=folder,
        )
        assert finished.returncode == 0, finished.stderr[-4000:]
        assert finished.stdout.count(f"{name}.mp4:") == 1
        lumas.append(read_luma((folder / f"{name}.mp4").read_bytes()))
    return lumas[0], lumas[1]
