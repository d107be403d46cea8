"""One process vs N ranks of a spatial-shard decode on the CPU (gloo), per VAE family and shard axis.

    python bench/distributed.py                    # every family, 2 ranks; writes docs/distributed.md and .png
    python bench/distributed.py --quick            # a tiny size in seconds, prints only
    python bench/distributed.py --family wan21 --ranks 3 --no-write

Each run is a fresh set of processes (torch.multiprocessing spawn), so a process's peak RSS (VmHWM, reset
through /proc/self/clear_refs just before the decode) is that decode's. The single process is
``decode_to_mp4`` with the family's plain streaming adapter; the sharded runs build theirs with
``streamvae.distributed.sharded_decoder(vae, shard=...)`` (``ShardedWanDecoder`` where that factory is not
there yet). A family whose VAE or sharded adapter raises is skipped with the reason printed. Every process
runs the same number of torch threads (default 1): PyTorch picks its CPU convolution kernel by thread count
and input size, and the sharded decode must pick the kernel of the whole frame to stay exact.

What is compared, side by side in one run: every chunk (``torch.equal``, else max |Δ|) and the MP4 bytes,
wall time (slowest rank) and CPU time (busiest rank: what the wall would be on idle cores, since other
processes on a shared machine stretch the wall of the 2-core sharded run but not of the 1-core single
one), decode memory per rank under a stable allocator (``MALLOC_MMAP_THRESHOLD_`` = 1 MiB; ``--glibc``
adds glibc's default), and the collectives per latent frame.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import memory_mib, reset_peak_rss
from _report import table_head

DOCS = Path(__file__).resolve().parent.parent / "docs"
DOC, PLOT = DOCS / "distributed.md", DOCS / "distributed.png"
BEGIN, END = "<!-- begin bench -->", "<!-- end bench -->"
# Deterministic x264 (no SIMD: its output is not deterministic at widths that are not multiples of 64), so
# equal chunks give equal MP4 bytes and the MP4 column compares the decodes, not x264's run-to-run noise.
CODEC = {"preset": "veryfast", "threads": "1", "x264-params": "asm=0"}
STABLE = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # every large block goes back to the OS when freed
# glibc's default raises its mmap threshold up to 32 MiB as large blocks are freed, then keeps freed blocks
# below it in the heap, where they still count as RSS: its peaks move by hundreds of MiB between runs.
ALLOCATORS = {"MALLOC_MMAP_THRESHOLD_=1 MiB": STABLE, "glibc default": {}}


# ---------------------------------------------------------------------------------------------------------
# The families: each a diffusers VAE at a fraction of its real width (activations, not weights, dominate),
# a latent whose decode takes well under a minute in one process, and a tiny one for --quick.


@dataclass(frozen=True)
class Family:
    title: str
    build: Callable[[bool], nn.Module]  # quick -> a seeded VAE
    latent: tuple[int, ...]  # C, T, H, W
    quick_latent: tuple[int, ...]
    config: str  # what the layout is, for the table


def _wan21(quick: bool) -> nn.Module:
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8 if quick else 32, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2)


def _wan22(quick: bool) -> nn.Module:
    from diffusers import AutoencoderKLWan

    base = 8 if quick else 16
    return AutoencoderKLWan(
        base_dim=base,
        decoder_base_dim=2 * base,
        z_dim=48,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        is_residual=True,
        patch_size=2,
        scale_factor_spatial=16,
        in_channels=12,
        out_channels=12,
        latents_mean=[0.0] * 48,
        latents_std=[1.0] * 48,
    )


def _hunyuan(quick: bool) -> nn.Module:
    from diffusers import AutoencoderKLHunyuanVideo

    width = 8 if quick else 32
    channels = (width, 2 * width, 4 * width, 4 * width)
    return AutoencoderKLHunyuanVideo(
        latent_channels=16, block_out_channels=channels, layers_per_block=2, norm_num_groups=4 if quick else 8
    )


def _ltx(quick: bool) -> nn.Module:
    from diffusers import AutoencoderKLLTXVideo

    width = 8 if quick else 32
    channels = (width, 2 * width, 4 * width, 4 * width)
    return AutoencoderKLLTXVideo(
        latent_channels=32, block_out_channels=channels, decoder_block_out_channels=channels
    )


def _cogvideox(quick: bool) -> nn.Module:
    from diffusers import AutoencoderKLCogVideoX

    width = 8 if quick else 32
    channels = (width, 2 * width, 4 * width, 4 * width)
    return AutoencoderKLCogVideoX(
        latent_channels=16, block_out_channels=channels, layers_per_block=3, norm_num_groups=4 if quick else 8
    )


FAMILIES = {
    "wan21": Family("Wan 2.1", _wan21, (16, 5, 30, 52), (16, 2, 8, 8), "base_dim 32, num_res_blocks 2"),
    "wan22": Family("Wan 2.2", _wan22, (48, 5, 15, 26), (48, 2, 4, 4), "base_dim 16, decoder_base_dim 32"),
    "hunyuan": Family(
        "HunyuanVideo", _hunyuan, (16, 5, 30, 52), (16, 2, 8, 8), "block_out_channels 32-128, 2 layers"
    ),
    "ltx": Family("LTX-Video", _ltx, (32, 3, 8, 13), (32, 2, 2, 2), "block_out_channels 32-128"),
    "cogvideox": Family(
        "CogVideoX", _cogvideox, (16, 5, 30, 52), (16, 2, 8, 8), "block_out_channels 32-128, 3 layers"
    ),
}


# ---------------------------------------------------------------------------------------------------------
# One rank's run, in a spawned process.


@dataclass
class RankRun:
    rank: int
    seconds: float  # decode_to_mp4, start to return
    cpu_seconds: float  # this process's CPU time over it, every thread
    peak_mib: float  # VmHWM during the decode
    before_mib: float  # VmRSS just before it (torch, diffusers, weights, latent)
    stats: dict[str, Any] = field(default_factory=dict)  # the sharded decoder's ShardedDecodeStats

    @property
    def decode_mib(self) -> float:
        return self.peak_mib - self.before_mib


def _sharded(vae: nn.Module, shard: str) -> Any:
    import streamvae.distributed as distributed

    factory = getattr(distributed, "sharded_decoder", None)
    if factory is not None:
        return factory(vae, shard=shard)
    return distributed.ShardedWanDecoder(vae, shard=shard)  # type: ignore[arg-type]


def _teed(decoder: Any, folder: Path) -> None:
    """Save every chunk the output rank publishes, to compare them with the single process's."""
    plain = decoder.decode_with_chunks

    def decode_with_chunks(z: torch.Tensor, *, on_chunk: Callable[[torch.Tensor], None]) -> None:
        count = 0

        def tee(chunk: torch.Tensor) -> None:
            nonlocal count
            torch.save(chunk, folder / f"chunk{count}.pt")
            count += 1
            on_chunk(chunk)

        plain(z, on_chunk=tee)

    decoder.decode_with_chunks = decode_with_chunks


def _rank(rank: int, world: int, family: str, quick: bool, shard: str, threads: int, folder: str) -> None:
    from streamvae import decode_to_mp4
    from streamvae.models import chunked_decoder

    out = Path(folder)
    try:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        spec = FAMILIES[family]
        vae = spec.build(quick).eval()
        shape = spec.quick_latent if quick else spec.latent
        z = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0))
        if world > 1:
            dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
            decoder = _sharded(vae, shard)
        else:
            decoder = chunked_decoder(vae)
        if rank == 0:
            _teed(decoder, out)
        reset_peak_rss()  # VmHWM restarts from the current RSS (Linux ≥ 4.0)
        before, _ = memory_mib()
        started, cpu = time.perf_counter(), time.process_time()
        videos = anyio.run(functools.partial(decode_to_mp4, decoder, z, fps=16, video_codec_options=CODEC))
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
        stats = dict(vars(decoder.stats)) if world > 1 else {}
        run = RankRun(rank, seconds, cpu_seconds, memory_mib()[1], before, stats)
        if rank == 0:
            (out / "video.mp4").write_bytes(videos[0])
        (out / f"rank{rank}.json").write_text(json.dumps(asdict(run)))
        if world > 1:
            dist.destroy_process_group()
    except Exception as error:  # a family without sharded support: reported, not fatal to the bench
        (out / f"error{rank}.txt").write_text(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        raise


# ---------------------------------------------------------------------------------------------------------
# The parent: fresh processes for each run, then the comparison.


@dataclass
class Result:
    family: str
    shard: str  # "" for the single process
    runs: list[RankRun]
    exact: str  # the comparison with the single process
    latent_frames: int


class Skipped(Exception):
    pass


def measure(world: int, family: str, quick: bool, shard: str, threads: int, env: dict[str, str]) -> Path:
    """The folder where the run left its ranks' JSON, chunks and MP4 (Skipped if a rank raised)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # spawned processes start with the parent's environment
    folder = Path(tempfile.mkdtemp(prefix="streamvae-bench-"))
    try:
        mp.start_processes(
            _rank,
            args=(world, family, quick, shard, threads, str(folder)),
            nprocs=world,
            start_method="spawn",
        )
    except mp.ProcessRaisedException as error:
        errors = sorted(folder.glob("error*.txt"))
        reason = errors[0].read_text().splitlines()[0] if errors else str(error).strip().splitlines()[-1]
        shutil.rmtree(folder)
        raise Skipped(reason) from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return folder


def _runs(folder: Path, world: int) -> list[RankRun]:
    return [RankRun(**json.loads((folder / f"rank{r}.json").read_text())) for r in range(world)]


def compare(single: Path, sharded: Path) -> str:
    """``torch.equal`` (and whether the MP4 bytes match), else the max |Δ| over every chunk."""
    count = len(list(single.glob("chunk*.pt")))
    if count != len(list(sharded.glob("chunk*.pt"))):
        return "different chunk count"
    worst, equal = 0.0, True
    for i in range(count):
        a, b = (torch.load(f / f"chunk{i}.pt") for f in (single, sharded))
        if a.shape != b.shape:
            return f"chunk {i}: shape {list(b.shape)} ≠ {list(a.shape)}"
        equal = equal and torch.equal(a, b)
        worst = max(worst, float((a.float() - b.float()).abs().max()))
    same_mp4 = (single / "video.mp4").read_bytes() == (sharded / "video.mp4").read_bytes()
    if equal:  # equal chunks must encode to equal bytes (libx264, one thread): else the encoder got others
        return "torch.equal, MP4 identical" if same_mp4 else "torch.equal, **MP4 differs**"
    return f"max \\|Δ\\| {worst:.1e}, MP4 {'identical' if same_mp4 else 'differs'}"


def bench_family(
    family: str, quick: bool, world: int, threads: int, env: dict[str, str]
) -> list[Result] | str:
    """The single process and each axis for ``family``, or why it was skipped."""
    spec = FAMILIES[family]
    frames = (spec.quick_latent if quick else spec.latent)[1]
    try:
        single_folder = measure(1, family, quick, "", threads, env)
    except Skipped as why:
        return f"the single-process decode raised {why}"
    results = [Result(family, "", _runs(single_folder, 1), "", frames)]
    for shard in ("height", "width"):
        try:
            folder = measure(world, family, quick, shard, threads, env)
        except Skipped as why:
            results.append(Result(family, shard, [], f"skipped: {why}", frames))
            continue
        results.append(Result(family, shard, _runs(folder, world), compare(single_folder, folder), frames))
        shutil.rmtree(folder)
    shutil.rmtree(single_folder)
    return results


# ---------------------------------------------------------------------------------------------------------
# The report.


def _per_frame(run: RankRun, frames: int) -> str:
    stats = run.stats
    total = stats.get("collectives", 0) / frames
    parts = [f"{stats.get(key, 0) / frames:.3g} {label}" for key, label in _COUNTED if stats.get(key)]
    return f"{total:.1f} ({', '.join(parts)})" if parts else f"{total:.1f}"


_COUNTED = (("halo_exchanges", "halo"), ("attention_gathers", "attention"), ("norm_reductions", "norm"))


def ratios(results: list[Result]) -> dict[str, tuple[float, float, float]]:
    """axis -> (wall, CPU, memory) of the sharded run ÷ the single process's (slowest / largest rank)."""
    single = results[0].runs[0]
    out = {}
    for result in results[1:]:
        if result.runs:
            wall = max(r.seconds for r in result.runs) / single.seconds
            cpu = max(r.cpu_seconds for r in result.runs) / single.cpu_seconds
            memory = max(r.decode_mib for r in result.runs) / single.decode_mib
            out[result.shard] = (wall, cpu, memory)
    return out


COLUMNS = (
    "family (latent → video) | run | wall | CPU | decode memory | ÷ 1 process: wall / CPU / memory "
    "| vs 1 process | collectives / latent frame"
)


def table(by_family: dict[str, list[Result] | str], world: int, threads: int, quick: bool) -> list[str]:
    lines = table_head(COLUMNS)
    for family, results in by_family.items():
        spec = FAMILIES[family]
        if isinstance(results, str):
            lines.append(f"| {spec.title} | skipped: {results} | | | | | | |")
            continue
        single = results[0].runs[0]
        c, t, h, w = spec.quick_latent if quick else spec.latent
        name = f"{spec.title}, {'quick' if quick else spec.config} ([{c}, {t}, {h}, {w}])"
        lines.append(
            f"| {name} | 1 process | {single.seconds:.1f} s | {single.cpu_seconds:.1f} s | "
            f"{single.decode_mib:.0f} MiB | | | |"
        )
        by_axis = ratios(results)
        for result in results[1:]:
            if not result.runs:
                lines.append(f"| | {world} ranks, {result.shard} | | | | | {result.exact} | |")
                continue
            wall, cpu, memory = by_axis[result.shard]
            slowest = max(result.runs, key=lambda r: r.seconds)
            busiest = max(result.runs, key=lambda r: r.cpu_seconds)
            largest = max(result.runs, key=lambda r: r.decode_mib)
            lines.append(
                f"| | {world} ranks, {result.shard} | {slowest.seconds:.1f} s | {busiest.cpu_seconds:.1f} s | "
                f"{largest.decode_mib:.0f} MiB (rank {largest.rank}) | **{wall:.2f}× / {cpu:.2f}× / "
                f"{memory:.2f}×** | {result.exact} | {_per_frame(result.runs[0], result.latent_frames)} |"
            )
    return lines


def report(
    by_allocator: dict[str, dict[str, list[Result] | str]], world: int, threads: int, quick: bool, load: str
) -> str:
    command = "python bench/distributed.py" + (" --quick" if quick else "")
    lines = [
        f"## Measured: 1 process vs {world} ranks (`{command}`)",
        "",
        f"CPU ({os.cpu_count()} cores), {threads} torch thread(s) in every process, gloo, libx264 `{CODEC}`; "
        f"the output rank also gathers, encodes and publishes. Load average over the run: {load}. "
        "*wall*: the slowest rank's `decode_to_mp4`; *CPU*: the busiest rank's CPU time over it (every "
        "thread); *decode memory*: VmHWM over the decode minus the RSS just before it (weights, latent and "
        "imports excluded), the largest rank's. Each run is a fresh set of processes.",
    ]
    for allocator, by_family in by_allocator.items():
        lines += ["", f"Allocator: {allocator}", "", *table(by_family, world, threads, quick)]
    return "\n".join(lines)


def plot(by_family: dict[str, list[Result] | str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, walls, cpus, memories = [], [], [], []
    for family, results in by_family.items():
        if isinstance(results, str):
            continue
        for axis, (wall, cpu, memory) in ratios(results).items():
            labels.append(f"{FAMILIES[family].title}\n{axis}")
            walls.append(wall)
            cpus.append(cpu)
            memories.append(memory)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.3 * len(labels)), 4))
    xs = range(len(labels))
    for offset, values, name in ((-0.27, walls, "wall"), (0.0, cpus, "CPU time"), (0.27, memories, "memory")):
        axes.bar([x + offset for x in xs], values, width=0.27, label=name)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks(list(xs), labels)
    axes.set_ylabel("2 ranks ÷ 1 process (largest rank)")
    axes.set_title("Sharded decode on the CPU: each rank's share of the single process's cost")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_into_docs(body: str) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} … {END} section to replace")
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(f"{head}{BEGIN}\n{body}\n{END}{rest.split(END, 1)[1]}")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: every family")
    parser.add_argument(
        "--quick", action="store_true", help="a tiny size in seconds (Wan 2.1 unless --family)"
    )
    parser.add_argument("--glibc", action="store_true", help="also measure under glibc's default allocator")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every process")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    families = args.family or (["wan21"] if args.quick else list(FAMILIES))
    allocators = ALLOCATORS if args.glibc else {name: ALLOCATORS[name] for name in list(ALLOCATORS)[:1]}
    loads = [_load()]
    by_allocator: dict[str, dict[str, list[Result] | str]] = {}
    for allocator, env in allocators.items():
        by_family: dict[str, list[Result] | str] = {}
        for family in families:
            by_family[family] = results = bench_family(family, args.quick, args.ranks, args.threads, env)
            if isinstance(results, str):
                print(f"{FAMILIES[family].title}: skipped, {results}", flush=True)
            loads.append(_load())
        by_allocator[allocator] = by_family
    body = report(by_allocator, args.ranks, args.threads, args.quick, f"{min(loads)}–{max(loads)}")
    print(body)
    if not args.no_write and not args.quick:
        write_into_docs(body)
        plot(next(iter(by_allocator.values())), PLOT)
        print(f"\nwrote {DOC} and {PLOT}")


if __name__ == "__main__":
    main()
