"""Single-rank vs N-rank spatial-shard decode on the CPU (gloo): wall time and peak memory per rank.

    python bench/distributed.py                 # 2 ranks; writes its table into docs/distributed.md
    python bench/distributed.py --ranks 3 --no-write

Each run is a fresh set of processes (torch.multiprocessing spawn), so a process's peak RSS (VmHWM, reset
through /proc/self/clear_refs just before the decode) is that decode's. The single-rank run is
``decode_to_mp4`` with the plain streaming adapter. Every process runs the same number of torch threads
(default 1): PyTorch picks its CPU convolution kernel by thread count (oneDNN with several threads, vol2col
+ GEMM with one), and a different kernel would change the memory being compared. CPU gloo is not expected to
be faster: the point is the memory per rank.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from diffusers import AutoencoderKLWan

from streamvae import decode_to_mp4
from streamvae.distributed import ShardedWanDecoder

DOC = Path(__file__).resolve().parent.parent / "docs" / "distributed.md"
BEGIN, END = "<!-- begin bench -->", "<!-- end bench -->"
# Wan 2.1's decoder layout at a third of its width (base_dim 96 → 32): activations, not weights, dominate.
CONFIG: dict[str, Any] = dict(base_dim=32, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2)
CODEC = {"preset": "veryfast", "threads": "1"}


@dataclass
class RankRun:
    rank: int
    seconds: float  # decode_to_mp4, start to return
    peak_mib: float  # VmHWM during the decode
    before_mib: float  # VmRSS just before it (torch, diffusers, weights, latent)
    collectives: int


def _status_mib(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert match is not None, field
    return int(match.group(1)) / 1024


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux ≥ 4.0)


def _build(shape: tuple[int, int, int]) -> tuple[AutoencoderKLWan, torch.Tensor]:
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**CONFIG).eval()
    z = torch.randn(1, 16, *shape, generator=torch.Generator().manual_seed(0))
    return vae, z


def _rank(rank: int, world: int, threads: int, shape: tuple[int, int, int], folder: str) -> None:
    torch.set_num_threads(threads)
    vae, z = _build(shape)
    decoder: Any = vae
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
        decoder = ShardedWanDecoder(vae, shard="height")
    _reset_peak()
    before = _status_mib("VmRSS")
    started = time.perf_counter()
    anyio.run(functools.partial(decode_to_mp4, decoder, z, fps=16, video_codec_options=CODEC))
    seconds = time.perf_counter() - started
    collectives = decoder.stats.collectives if world > 1 else 0
    run = RankRun(rank, seconds, _status_mib("VmHWM"), before, collectives)
    Path(folder, f"rank{rank}.json").write_text(json.dumps(asdict(run)))
    if world > 1:
        dist.destroy_process_group()


# glibc's default raises its mmap threshold up to 32 MiB as large blocks are freed, then keeps freed blocks
# below it in the heap, where they still count as RSS; a fixed threshold returns every large block at once.
ALLOCATORS = {"glibc default": {}, "MALLOC_MMAP_THRESHOLD_=1 MiB": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}}


def measure(world: int, threads: int, shape: tuple[int, int, int], env: dict[str, str]) -> list[RankRun]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # spawned processes start with the parent's environment
    try:
        with tempfile.TemporaryDirectory() as folder:
            mp.start_processes(
                _rank, args=(world, threads, shape, folder), nprocs=world, start_method="spawn"
            )
            return [RankRun(**json.loads(Path(folder, f"rank{r}.json").read_text())) for r in range(world)]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _row(label: str, run: RankRun, collectives: str) -> str:
    decode = run.peak_mib - run.before_mib
    return f"| {label} | {run.seconds:.2f} s | {run.peak_mib:.0f} MiB | {decode:.0f} MiB | {collectives} |"


def table(
    runs: dict[str, tuple[RankRun, list[RankRun]]], shape: tuple[int, int, int], threads: int, cores: int
) -> str:
    frames, height, width = shape
    world = len(next(iter(runs.values()))[1])
    lines = [
        f"## Measured: 1 rank vs {world} ranks (`python bench/distributed.py`)",
        "",
        f"Wan 2.1 decoder layout at base_dim 32 (`{CONFIG}`), latent [1, 16, {frames}, {height}, {width}] →",
        f"{1 + 4 * (frames - 1)} frames of {8 * height}×{8 * width}, libx264 `{CODEC}`, CPU ({cores} cores), "
        f"{threads} torch thread(s) in every process: the single rank uses {threads} core(s), the {world} "
        f"ranks {world * threads}. Sharded by height over gloo; the output rank also encodes. Peak = VmHWM "
        "over the decode; *decode memory* = peak minus the RSS just before it (weights, latent and imports "
        "excluded). Each run is a fresh set of processes.",
    ]
    for allocator, (single, sharded) in runs.items():
        lines += [
            "",
            f"Allocator: {allocator}",
            "",
            "| run | wall | peak RSS | decode memory | collectives |",
            "|---|---|---|---|---|",
            _row("1 rank", single, "–"),
        ]
        for run in sharded:
            role = "output rank" if run.rank == 0 else "rank"
            lines.append(_row(f"{world} ranks: {role} {run.rank}", run, str(run.collectives)))
        slowest = max(run.seconds for run in sharded)
        worst = max(run.peak_mib - run.before_mib for run in sharded)
        lines += [
            "",
            f"{world} ranks ÷ 1 rank: wall **{slowest / single.seconds:.2f}×** (slowest rank), decode memory "
            f"per rank **{worst / (single.peak_mib - single.before_mib):.2f}×** (largest rank).",
        ]
    return "\n".join(lines)


def write_into_docs(body: str) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} … {END} section to replace")
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(f"{head}{BEGIN}\n{body}\n{END}{rest.split(END, 1)[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--height", type=int, default=32, help="latent rows (8 pixels each)")
    parser.add_argument("--width", type=int, default=32, help="latent columns (8 pixels each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every process")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    shape = (args.frames, args.height, args.width)
    runs = {}
    for allocator, env in ALLOCATORS.items():
        (single,) = measure(1, args.threads, shape, env)
        runs[allocator] = (single, measure(args.ranks, args.threads, shape, env))
    body = table(runs, shape, args.threads, os.cpu_count() or 1)
    print(body)
    if not args.no_write:
        write_into_docs(body)
        print(f"\nwrote {DOC}")


if __name__ == "__main__":
    main()
