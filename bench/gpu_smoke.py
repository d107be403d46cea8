"""GPU smoke: what the CPU tests cannot check, in one process, in about a minute on one GPU.

    python bench/gpu_smoke.py                  # every check
    python bench/gpu_smoke.py --list           # the check names, one a line
    python bench/gpu_smoke.py --only syncs.    # the checks whose name starts with a prefix (repeatable)

Every check prints one line: OK or MISMATCH with its numbers, FAIL with the exception (its traceback
indented below), or SKIP with the reason. A failing check never stops the next; the exit status is 1 if any
check did not pass, and a summary table comes last. Without CUDA every check still runs its logic on the CPU
(streams, events and sync counting do nothing there) and reports SKIP when that dry run passed, so the
script is known to work before a GPU is lent: tests/test_gpu_smoke.py runs it in CI.

- ``chunks.<schedule>.<pixel format>``: CUDA chunks through ``ChunkedVideoMP4Session`` against the same
  chunks pushed on the CPU, compared as the uint8 frames each ``EntryEncoder.encode`` call receives: exact
  for rgb24 and for yuv420p's Y plane, chroma within 1 level (the 2×2 mean may sum in another order). Each
  schedule runs on asyncio and trio with the ring, and with ``transfer_slots=0``.
  ``late_producer``: each chunk is written on the producer's own stream after a long ``_sleep`` and pushed
  at once, unsynchronized: only the ready event recorded at push orders the quantize after the write.
  ``reused_memory``: the quantize waits for a ready event recorded behind a long spell on the pushing
  stream, while the producer drops the pushed chunk and at once fills new tensors of its size on the idle
  stream that allocated it: only ``record_stream`` keeps the caching allocator from handing the chunk's
  block back before the quantize has read it.
  ``caller_stream_finish``: the last chunk is written on a busy caller stream that stays current around
  ``finish()``, with a last group short of ``batch_frames``.
  The first two also run a control without the safeguard (event on the default stream; ``record_stream``
  made a no-op): a control that matches means the schedule was too gentle to catch its loss.
- ``syncs.*``: host synchronizations (``torch.cuda.set_sync_debug_mode("warn")``) during ``decode_to_mp4``
  of a tiny Wan VAE (latent on the device, and on the host), and during a one-rank NCCL
  ``ShardedWanDecoder`` decode, by file:line and thread. None may run on the event loop thread. A hook on
  ``warnings.showwarning`` records them in whichever thread warns (a self-test warns once on the loop and
  once in a worker thread, to show both are seen).
- ``sharded.stream``: a one-rank sharded stream of latent pieces (NCCL on CUDA) writes the frames of the
  single process's ``decode_to_mp4`` of the whole latent, with no host synchronization on the loop thread.
- ``wan.untiled_equal``: chunks concatenated ``torch.equal`` to ``vae.decode`` on the device (Wan 2.1, 2.2).
  ``wan.tiled``: the same with ``enable_tiling`` on a latent of 2×3 tiles; the maximum difference is
  reported (cuDNN may pick other algorithms), within 1 uint8 level passes.
- ``stream_mp4.leave_early``: a client that leaves after the first bytes leaves no open container and no
  CUDA memory allocated behind it (two runs after a warm-up: a leak grows, a one-off cache does not).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import math
import os
import platform
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from importlib import metadata
from typing import Any

import anyio
import numpy as np
import torch
from torch import Tensor, nn

from streamvae import ChunkedVideoMP4Session, decode_to_mp4, quantize_chunk, stream_mp4
from streamvae._codec_options import auto_video_codec
from streamvae._encode import EntryEncoder
from streamvae.models import chunked_decoder
from streamvae.testing import TINY_VAE_CONFIGS, enable_small_tiling, open_containers

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")
try:
    import trio  # noqa: F401

    BACKENDS = ["asyncio", "trio"]
except ImportError:
    BACKENDS = ["asyncio"]

FPS = 16
FAST = {"preset": "ultrafast", "threads": "1"}  # the encode is not what is checked here
TIMEOUT_S = 120  # a hung session fails its check instead of the whole smoke
SLEEP_MS = 25  # how long a delayed stream spins before its work
GATE_MS = 150  # how long a ready event waits behind a busy stream (longer than the pipeline's host steps)
GARBAGE = 0.3  # what a reader that does not wait for the producer's write would see
HEIGHT, WIDTH, BATCH = 96, 128, 2
CHUNK_FRAMES = (1, 4, 4, 4, 4)  # Wan-like: 17 frames, not a multiple of 2 or 4
SYNC_WARNING = "synchronizing CUDA operation"
MARKER = "gpu_smoke capture self-test"


class Skip(Exception):
    """The check cannot run here; the message says why."""


@dataclass
class Result:
    name: str
    outcome: str  # OK, MISMATCH, FAIL or SKIP
    numbers: str
    seconds: float


# ------------------------------------------------------------------------------------------ device helpers


def new_stream() -> Any:
    return torch.cuda.Stream(DEVICE) if CUDA else None


def on_stream(stream: Any) -> contextlib.AbstractContextManager[Any]:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


@functools.cache
def cycles_per_ms() -> float:
    torch.cuda._sleep(1000)  # the first launch loads the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def busy(ms: float) -> None:
    """Queue ``ms`` milliseconds of spinning on the current stream (nothing on a CPU)."""
    if CUDA:
        torch.cuda._sleep(int(ms * cycles_per_ms()))


def event_now() -> Any:
    """An event recorded on the current stream (None on a CPU)."""
    if not CUDA:
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def still_pending(event: Any) -> bool:
    return event is not None and not event.query()


def settle() -> None:
    """Wait for the device, collect garbage and drop cuBLAS workspaces, so allocated memory is only tensors."""
    gc.collect()
    if CUDA:
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()


def allocated() -> int:
    return torch.cuda.memory_allocated(DEVICE) if CUDA else 0


# ------------------------------------------------------------------- tiny VAEs (the configs of tests/_vaes.py)


def _randomize(vae: nn.Module, seed: int) -> None:
    """Re-draw every parameter, scaled by fan-in: outputs span the value range and a share hits the clamp."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith("gamma"):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif param.ndim > 1:
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param[0].numel()))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def tiny_wan21(seed: int = 1) -> nn.Module:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**TINY_VAE_CONFIGS["wan21"])
    _randomize(vae, seed)
    return vae.eval().to(DEVICE)


def tiny_wan22(seed: int = 2) -> nn.Module:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**TINY_VAE_CONFIGS["wan22"])
    _randomize(vae, seed)
    return vae.eval().to(DEVICE)


def latent(vae: nn.Module, batch: int, frames: int, h: int, w: int, seed: int = 0) -> Tensor:
    """A seeded standard-normal latent, drawn on the CPU (the same numbers everywhere), on DEVICE."""
    generator = torch.Generator().manual_seed(seed)
    z_dim = int(vae.config.z_dim)  # type: ignore[union-attr]
    return torch.randn(batch, z_dim, frames, h, w, generator=generator).to(DEVICE)


# ----------------------------------------------------------------------------- what the encoders receive


class EncoderInputs:
    """Copies of the uint8 frames every ``EntryEncoder.encode`` call received, per encoder (batch entry)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.encoders: list[EntryEncoder] = []  # in creation order: the session creates them entry by entry
        self.frames: dict[EntryEncoder, list[np.ndarray]] = {}

    def entries(self) -> list[np.ndarray]:
        return [np.concatenate(self.frames[encoder]) for encoder in self.encoders]


@contextlib.contextmanager
def recording_encoder_inputs() -> Iterator[EncoderInputs]:
    inputs = EncoderInputs()
    init, encode = EntryEncoder.__init__, EntryEncoder.encode

    def recording_init(self: EntryEncoder, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        with inputs.lock:
            inputs.encoders.append(self)
            inputs.frames[self] = []

    def recording_encode(self: EntryEncoder, frames: np.ndarray) -> bytes:
        inputs.frames[self].append(np.array(frames, copy=True))
        return encode(self, frames)

    EntryEncoder.__init__ = recording_init  # type: ignore[method-assign]
    EntryEncoder.encode = recording_encode  # type: ignore[method-assign]
    try:
        yield inputs
    finally:
        EntryEncoder.__init__ = init  # type: ignore[method-assign]
        EntryEncoder.encode = encode  # type: ignore[method-assign]


def compare(pixel_format: str, got: list[np.ndarray], want: list[np.ndarray]) -> tuple[bool, str]:
    """Exact for rgb24 and yuv420p luma, chroma within 1 level; the numbers say how far apart they are."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want, strict=False)):
        return False, f"shapes {[g.shape for g in got]} vs {[w.shape for w in want]}"
    diffs = [np.abs(g.astype(np.int16) - w.astype(np.int16)) for g, w in zip(got, want, strict=True)]
    if pixel_format == "rgb24":
        worst = max(int(d.max()) for d in diffs)
        return worst == 0, f"Δ {worst}"
    luma = max(int(d[:, :HEIGHT].max()) for d in diffs)
    chroma = max(int(d[:, HEIGHT:].max()) for d in diffs)
    return luma == 0 and chroma <= 1, f"Y Δ {luma}, chroma Δ {chroma}"


# -------------------------------------------------------------------------------- chunk schedules

Producer = Callable[[ChunkedVideoMP4Session, list[Tensor]], Awaitable[dict[str, Any]]]


def host_chunks() -> list[Tensor]:
    """Seeded noise in [-1.2, 1.2]: every pixel value, a share clamped at both ends."""
    generator = torch.Generator().manual_seed(0)
    return [torch.rand(BATCH, 3, t, HEIGHT, WIDTH, generator=generator) * 2.4 - 1.2 for t in CHUNK_FRAMES]


async def push_all(session: ChunkedVideoMP4Session, chunks: list[Tensor]) -> dict[str, Any]:
    for chunk in chunks:
        await session.push(chunk)
    return {"videos": await session.finish()}


def late_producer(*, control: bool = False) -> Producer:
    async def produce(session: ChunkedVideoMP4Session, sources: list[Tensor]) -> dict[str, Any]:
        producer, late = new_stream(), 0
        for source in sources:
            with on_stream(producer):
                chunk = torch.full_like(source, GARBAGE)  # allocated and filled on the producer's stream
                busy(SLEEP_MS)  # the decode is still running...
                chunk.copy_(source)  # ...and writes the chunk only after it
                written = event_now()
            # The push records the ready event on the current stream: the producer's, unless this is the
            # control, which pushes from the default stream as a producer that forgot its stream would.
            with on_stream(None if control else producer):
                await session.push(chunk)
            late += still_pending(written)
            del chunk
        return {"videos": await session.finish(), "late": f"{late}/{len(sources)}"}

    return produce


def reusing_producer() -> Producer:
    async def produce(session: ChunkedVideoMP4Session, sources: list[Tensor]) -> dict[str, Any]:
        allocator, pusher = new_stream(), new_stream()
        kept, reused, open_windows, retained = [], 0, 0, 0
        for source in sources:
            with on_stream(allocator):
                chunk = source.clone()  # its block belongs to the allocator's stream
            if CUDA:
                pusher.wait_stream(allocator)
            with on_stream(pusher):
                # The chunk is complete, but the ready event recorded at push comes only after this spell:
                # the quantize waits for it, long after the session has queued it and dropped the chunk.
                busy(GATE_MS)
                await session.push(chunk)
                ready = event_now()  # completes with the session's ready event: nothing runs between
            block, alive = chunk.data_ptr(), weakref.ref(chunk)
            del chunk
            with anyio.move_on_after(5):
                while alive() is not None:
                    await anyio.sleep(0.001)
            retained += alive() is not None
            open_windows += still_pending(ready)
            # Memory of the chunk's size, reused at once on the allocator's idle stream: handed the chunk's
            # block, the fill would overwrite it before the waiting quantize has read it.
            with on_stream(allocator):
                for _ in range(4):
                    fresh = torch.empty_like(source)
                    fresh.fill_(GARBAGE)
                    reused += fresh.data_ptr() == block
                    kept.append(fresh)
        videos = await session.finish()
        del kept
        notes: dict[str, Any] = {
            "videos": videos,
            "quantize still waiting when dropped": f"{open_windows}/{len(sources)}",
            "block handed back": reused,
        }
        if retained:
            notes["chunks the session kept over 5 s"] = retained
        return notes

    return produce


def finishing_producer() -> Producer:
    async def produce(session: ChunkedVideoMP4Session, sources: list[Tensor]) -> dict[str, Any]:
        for source in sources[:-1]:
            await session.push(source)
        caller = new_stream()
        with on_stream(caller):
            busy(SLEEP_MS)
            last = sources[-1] * 1.0  # written on the caller's stream after its busy spell
            await session.push(last)
            busy(SLEEP_MS)  # and still busy while the session finishes
            started = time.perf_counter()
            videos = await session.finish()
        return {"videos": videos, "finish": f"{(time.perf_counter() - started) * 1000:.0f} ms"}

    return produce


@contextlib.contextmanager
def record_stream_disabled() -> Iterator[None]:
    torch.Tensor.record_stream = lambda self, stream: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del torch.Tensor.record_stream  # the method of torch._C.TensorBase shows through again


# schedule -> (producer factory, batch_frames, control: (what it removes, how))
SCHEDULES: dict[str, tuple[Callable[[], Producer], int, tuple[str, Callable[[], Any]] | None]] = {
    "late_producer": (
        late_producer,
        1,
        (
            "ready event on the default stream",
            lambda: (late_producer(control=True), contextlib.nullcontext()),
        ),
    ),
    "reused_memory": (
        reusing_producer,
        2,
        ("record_stream a no-op", lambda: (reusing_producer(), record_stream_disabled())),
    ),
    "caller_stream_finish": (finishing_producer, 4, None),
}
VARIANTS = [(backend, 2) for backend in BACKENDS] + [("asyncio", 0)]  # (backend, transfer_slots)


def session_inputs(
    produce: Producer,
    chunks: list[Tensor],
    *,
    pixel_format: str,
    batch_frames: int,
    transfer_slots: int = 2,
    backend: str = "asyncio",
) -> tuple[list[np.ndarray], dict[str, Any]]:
    async def main() -> dict[str, Any]:
        with anyio.fail_after(TIMEOUT_S):
            async with ChunkedVideoMP4Session(
                value_range=(-1.0, 1.0),
                fps=FPS,
                pixel_format=pixel_format,  # type: ignore[arg-type]
                batch_frames=batch_frames,
                transfer_slots=transfer_slots,
                video_codec_options=FAST,
            ) as session:
                return await produce(session, chunks)

    with recording_encoder_inputs() as inputs:
        notes = anyio.run(main, backend=backend)
    videos = notes.pop("videos")
    if len(videos) != BATCH or not all(videos):
        raise RuntimeError(f"expected {BATCH} non-empty MP4s, got sizes {[len(v) for v in videos]}")
    return inputs.entries(), notes


@functools.cache
def cpu_reference(pixel_format: str) -> list[np.ndarray]:
    frames, _ = session_inputs(push_all, host_chunks(), pixel_format=pixel_format, batch_frames=1)
    return frames


def check_chunks(schedule: str, pixel_format: str) -> tuple[bool, str]:
    make_producer, batch_frames, control = SCHEDULES[schedule]
    reference = cpu_reference(pixel_format)
    sources = [chunk.to(DEVICE) for chunk in host_chunks()]
    if CUDA:
        cycles_per_ms()  # calibrated now, not inside a schedule (it synchronizes)
    settle()
    passed, parts = True, [f"{sum(CHUNK_FRAMES)} frames × {BATCH} entries, batch_frames={batch_frames}"]
    for backend, slots in VARIANTS:
        got, notes = session_inputs(
            make_producer(),
            sources,
            pixel_format=pixel_format,
            batch_frames=batch_frames,
            transfer_slots=slots,
            backend=backend,
        )
        ok, numbers = compare(pixel_format, got, reference)
        passed &= ok
        extra = "".join(f", {key} {value}" for key, value in notes.items())
        parts.append(f"{backend}/{'ring' if slots else 'blocking'}: {numbers}{extra}")
    if control is not None and CUDA:
        what, make = control
        produce, patch = make()
        with patch:
            got, notes = session_inputs(
                produce, sources, pixel_format=pixel_format, batch_frames=batch_frames
            )
        matched, numbers = compare(pixel_format, got, reference)
        numbers += "".join(f", {key} {value}" for key, value in notes.items())
        verdict = f"NOT caught, the schedule is too gentle ({numbers})" if matched else f"caught ({numbers})"
        parts.append(f"control, {what}: {verdict}")
    return passed, "; ".join(parts)


# --------------------------------------------------------------------------------- host synchronizations


@dataclass
class Warned:
    message: str
    where: str  # file:line the warning names
    thread: str  # "event loop" or the worker thread's name


@contextlib.contextmanager
def sync_debug_warn() -> Iterator[None]:
    if not CUDA:
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def counting_syncs(main: Callable[[], Awaitable[Any]], backend: str) -> tuple[Any, list[Warned]]:
    """Run ``main`` with every host synchronization warned about, and every warning of every thread kept.

    ``warnings.catch_warnings`` only saves and restores the module's state; the hook it restores is what
    records, and it is called in whichever thread warns (worker threads included), unlike ``record=True``
    whose list does not say which thread warned.
    """
    loop: list[int] = []
    seen: list[tuple[str, str, int, int, str]] = []

    def hook(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        seen.append((str(message), filename, lineno, threading.get_ident(), threading.current_thread().name))

    async def wrapped() -> Any:
        loop.append(threading.get_ident())
        warnings.warn(f"{MARKER} (loop)", stacklevel=1)
        await anyio.to_thread.run_sync(functools.partial(warnings.warn, f"{MARKER} (worker)", stacklevel=1))
        if not CUDA:  # no device to synchronize with: a stand-in shows the report's form in the dry run
            await anyio.to_thread.run_sync(functools.partial(warnings.warn, f"a {SYNC_WARNING} (stand-in)"))
        with anyio.fail_after(TIMEOUT_S), sync_debug_warn():
            return await main()

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        result = anyio.run(wrapped, backend=backend)
    warned = [
        Warned(
            message.splitlines()[0] if message else "",
            f"{os.path.basename(filename)}:{lineno}",
            "event loop" if ident == loop[0] else name[:40],
        )
        for message, filename, lineno, ident, name in seen
    ]
    return result, warned


def describe_syncs(warned: list[Warned]) -> tuple[bool, str]:
    """OK when the capture saw both self-test warnings and no synchronization ran on the event loop thread."""
    markers = {w.thread == "event loop" for w in warned if w.message.startswith(MARKER)}
    syncs = [w for w in warned if SYNC_WARNING in w.message]
    on_loop = [w for w in syncs if w.thread == "event loop"]
    others = [w for w in warned if SYNC_WARNING not in w.message and not w.message.startswith(MARKER)]
    text = f"loop {len(on_loop)}, workers {len(syncs) - len(on_loop)}"
    if on_loop:  # every place, these are what must go
        text += " [on the loop: " + ", ".join(
            f"{at} ×{n}" for at, n in Counter(w.where for w in on_loop).items()
        )
        text += "]"
    in_workers = Counter((w.where, w.thread) for w in syncs if w.thread != "event loop")
    if in_workers:
        text += " [" + ", ".join(f"{at} ×{n} ({thread})" for (at, thread), n in in_workers.most_common(8))
        text += ", …]" if len(in_workers) > 8 else "]"
    if others:
        text += f", {len(others)} other warning(s), first: {others[0].message[:80]!r} at {others[0].where}"
    if markers != {True, False}:
        return False, text + "; capture self-test FAILED: a loop or worker warning was not seen"
    return not on_loop, text


def check_syncs_decode(*, latent_on_host: bool) -> tuple[bool, str]:
    vae = tiny_wan21()
    z = latent(vae, 2, 5, 16, 16)
    if latent_on_host:
        z = z.cpu()  # a server that received the latent over the wire: decode_to_mp4 moves it

    def decode() -> Awaitable[list[bytes]]:
        return decode_to_mp4(vae, z, fps=FPS, video_codec_options=FAST)

    anyio.run(decode)  # warm-up: first kernels, cuDNN and cuBLAS handles, the encoder
    passed, parts = True, [f"latent {tuple(z.shape)} on {z.device.type}"]
    for backend in BACKENDS:
        videos, warned = counting_syncs(decode, backend)
        ok, text = describe_syncs(warned)
        passed &= ok and len(videos) == 2 and all(videos)
        parts.append(f"{backend}: {text}")
    return passed, "; ".join(parts)


@contextlib.contextmanager
def group_of_one() -> Iterator[Any]:
    """A process group of this process alone (NCCL on CUDA, else gloo), destroyed after if made here."""
    import torch.distributed as dist

    from streamvae.distributed import init_distributed

    if CUDA and not dist.is_nccl_available():
        raise Skip("this torch has no NCCL")
    created = not dist.is_initialized()
    device = init_distributed(timeout=timedelta(seconds=60))
    try:
        yield device
    finally:
        if created:
            dist.destroy_process_group()


def check_syncs_sharded() -> tuple[bool, str]:
    import torch.distributed as dist

    from streamvae.distributed import ShardedWanDecoder

    with group_of_one() as device:
        backend_name = str(dist.get_backend())
        vae = tiny_wan21()
        z = latent(vae, 1, 5, 16, 16).to(device)
        reference: list[Tensor] = []
        chunked_decoder(vae).decode_with_chunks(z, on_chunk=reference.append)
        decoder = ShardedWanDecoder(vae, shard="height")
        sharded: list[Tensor] = []
        decoder.decode_with_chunks(z, on_chunk=sharded.append)  # also the warm-up of the communicator
        equal = len(sharded) == len(reference) and all(
            torch.equal(a, b) for a, b in zip(sharded, reference, strict=True)
        )
        delta = max(float((a - b).abs().max()) for a, b in zip(sharded, reference, strict=True))

        def decode() -> Awaitable[list[bytes]]:
            return decode_to_mp4(decoder, z, fps=FPS, video_codec_options=FAST)

        passed = True
        parts = [
            f"{backend_name}, world size {dist.get_world_size()}, chunks equal to unsharded: {equal} (max |Δ| {delta:g})"
        ]
        for backend in BACKENDS:
            videos, warned = counting_syncs(decode, backend)
            ok, text = describe_syncs(warned)
            passed &= ok and len(videos) == 1 and bool(videos[0])
            parts.append(f"{backend}: {text}, {decoder.stats.collectives} collectives")
        return passed, "; ".join(parts)


def check_sharded_stream() -> tuple[bool, str]:
    """A one-rank sharded stream (NCCL on CUDA): pieces pushed through ``open_latent_stream`` give the frames
    of ``decode_to_mp4`` of the concatenated latent in one process (within 1 uint8 level: cuDNN may sum a
    strip differently), with no host synchronization on the event loop thread."""
    import torch.distributed as dist

    from streamvae import open_latent_stream
    from streamvae.distributed import sharded_decoder

    with group_of_one() as device:
        backend_name = str(dist.get_backend())
        vae = tiny_wan21()
        z = latent(vae, 1, 5, 16, 16).to(device)
        decoder = sharded_decoder(vae, shard="height")  # a group of one: one strip, every collective run
        codec = {"threads": "1", "x264-params": "asm=0"}

        async def stream() -> list[bytes]:
            async with open_latent_stream(decoder, fps=FPS, video_codec_options=codec) as opened:
                for piece in (z[:, :, :2], z[:, :, 2:3], z[:, :, 3:]):
                    await opened.push_latents(piece)
                return await opened.finish()

        passed, parts = True, [f"{backend_name}, world size {dist.get_world_size()}"]
        single = anyio.run(lambda: decode_to_mp4(vae, z, fps=FPS, video_codec_options=codec))
        for backend in BACKENDS:
            videos, warned = counting_syncs(stream, backend)
            ok, text = describe_syncs(warned)
            frames = [read_frames(videos[0]), read_frames(single[0])]
            same_shape = frames[0].shape == frames[1].shape
            levels = int(np.abs(frames[0].astype(int) - frames[1].astype(int)).max()) if same_shape else -1
            passed &= ok and same_shape and 0 <= levels <= 1
            parts.append(
                f"{backend}: {text}, frames {frames[0].shape[0]}, bytes equal {videos == single}, "
                f"max level Δ {levels}, {decoder.stats.collectives} collectives"
            )
        return passed, "; ".join(parts)


def read_frames(data: bytes) -> np.ndarray:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


# --------------------------------------------------------------------------------------- Wan exactness


def chunks_vs_decode(vae: Any, z: Tensor) -> tuple[bool, float, int]:
    """(torch.equal, max |Δ|, max uint8 levels apart) of the concatenated chunks and ``vae.decode``."""
    chunks: list[Tensor] = []
    chunked_decoder(vae).decode_with_chunks(z, on_chunk=chunks.append)
    with torch.no_grad():
        reference = vae.decode(z).sample
    streamed = torch.cat(chunks, dim=2)
    if streamed.shape != reference.shape:
        raise RuntimeError(f"chunks make {tuple(streamed.shape)}, vae.decode {tuple(reference.shape)}")
    delta = float((streamed - reference).abs().max())
    levels = int(
        (quantize_chunk(streamed, (-1, 1)).int() - quantize_chunk(reference, (-1, 1)).int()).abs().max()
    )
    return torch.equal(streamed, reference), delta, levels


def check_wan(*, tiled: bool) -> tuple[bool, str]:
    passed, parts = True, []
    for name, make, (batch, h, w) in (("2.1", tiny_wan21, (2, 8, 8)), ("2.2", tiny_wan22, (1, 8, 8))):
        vae = make()
        if tiled:
            enable_small_tiling(vae)
            h, w = 6, 7
        z = latent(vae, batch, 5, h, w)
        equal, delta, levels = chunks_vs_decode(vae, z)
        passed &= levels <= 1 if tiled else equal
        parts.append(f"Wan {name} {tuple(z.shape)}: equal {equal}, max |Δ| {delta:g}, uint8 Δ {levels}")
    return passed, "; ".join(parts)


# ------------------------------------------------------------------------------------ a client that leaves


def check_leave_early() -> tuple[bool, str]:
    vae = tiny_wan21()
    z = latent(vae, 1, 21, 16, 16)
    total = 1 + 4 * (z.shape[2] - 1)

    async def leave() -> tuple[int, int]:
        sessions: list[ChunkedVideoMP4Session] = []
        received = 0
        async with stream_mp4(
            vae, z, fps=FPS, keyframe_interval=4, video_codec_options=FAST, on_session=sessions.append
        ) as (video,):
            async for data in video:
                received += len(data)
                break
        return received, sessions[0].frames_pushed

    passed, parts = True, [f"{total} frames"]
    for backend in BACKENDS:
        anyio.run(leave, backend=backend)  # warm-up: worker threads, their handles and the encoder
        settle()
        before = allocated()
        runs = []
        for _ in range(2):
            received, pushed = anyio.run(leave, backend=backend)
            settle()
            runs.append((received, pushed, allocated() - before, open_containers()))
        passed &= all(r > 0 and grew == 0 and left == 0 for r, _, grew, left in runs)
        parts.append(
            f"{backend}: "
            + ", ".join(
                f"left after {r} B at frame {p}, CUDA memory {grew:+d} B, open containers {left}"
                for r, p, grew, left in runs
            )
        )
    return passed, "; ".join(parts)


def check_codec_auto() -> tuple[bool, str]:
    """Informational: what ``video_codec="auto"`` chooses here (no NVENC block on H100/H200/A100: libx264)."""
    started = time.perf_counter()
    chosen = auto_video_codec()
    return True, f"auto chose {chosen} (probe {1000 * (time.perf_counter() - started):.1f} ms)"


# ------------------------------------------------------------------------------------------------ runner

CHECKS: list[tuple[str, Callable[[], tuple[bool, str]]]] = [
    (f"chunks.{schedule}.{pixel_format}", functools.partial(check_chunks, schedule, pixel_format))
    for schedule in SCHEDULES
    for pixel_format in ("rgb24", "yuv420p")
]
CHECKS += [
    ("syncs.decode_to_mp4", functools.partial(check_syncs_decode, latent_on_host=False)),
    ("syncs.decode_to_mp4.host_latent", functools.partial(check_syncs_decode, latent_on_host=True)),
    ("syncs.sharded", check_syncs_sharded),
    ("sharded.stream", check_sharded_stream),
    ("wan.untiled_equal", functools.partial(check_wan, tiled=False)),
    ("wan.tiled", functools.partial(check_wan, tiled=True)),
    ("stream_mp4.leave_early", check_leave_early),
    ("codec.auto", check_codec_auto),
]


def run_check(name: str, check: Callable[[], tuple[bool, str]]) -> Result:
    started = time.perf_counter()
    trace = ""
    try:
        passed, numbers = check()
    except Skip as skip:
        outcome, numbers = "SKIP", str(skip)
    except Exception as error:
        outcome, numbers = "FAIL", f"{type(error).__name__}: {error}"
        trace = traceback.format_exc()
    else:
        if not passed:
            outcome = "MISMATCH"
        elif CUDA:
            outcome = "OK"
        else:
            outcome, numbers = "SKIP", f"no CUDA; CPU dry run passed: {numbers}"
    result = Result(name, outcome, numbers, time.perf_counter() - started)
    print(f"{outcome:<8} {name:<36} {numbers} ({result.seconds:.1f} s)", flush=True)
    if trace:
        print("".join(f"    {line}\n" for line in trace.rstrip().splitlines()), end="", flush=True)
    with contextlib.suppress(Exception):
        settle()  # the next check starts from a quiet device
    return result


def versions() -> str:
    names = ("torch", "diffusers", "av", "anyio", "trio", "numpy")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} missing")
    device = "no CUDA device"
    if CUDA:
        props = torch.cuda.get_device_properties(DEVICE)
        device = (
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()}"
        )
    return f"Python {platform.python_version()}; {', '.join(found)}; {device}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the check names and exit")
    parser.add_argument("--only", action="append", default=[], help="run the checks with this name prefix")
    args = parser.parse_args()
    if args.list:
        print("\n".join(name for name, _ in CHECKS))
        return 0
    selected = [(n, c) for n, c in CHECKS if not args.only or any(n.startswith(p) for p in args.only)]
    print(versions(), flush=True)
    print(
        f"backends {', '.join(BACKENDS)}; chunks {list(CHUNK_FRAMES)} frames of {HEIGHT}×{WIDTH}", flush=True
    )
    started = time.perf_counter()
    results = [run_check(name, check) for name, check in selected]
    print(f"\nsummary ({time.perf_counter() - started:.0f} s)")
    width = max((len(r.name) for r in results), default=5)
    print(f"{'check':<{width}}  {'outcome':<8}  numbers")
    for r in results:
        numbers = r.numbers if len(r.numbers) <= 100 else r.numbers[:99] + "…"
        print(f"{r.name:<{width}}  {r.outcome:<8}  {numbers}")
    return 1 if any(r.outcome in ("MISMATCH", "FAIL") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
