"""What the CPU tests cannot check: CUDA streams, ready events, the caching allocator and host
synchronizations, through the session, the decode, the sharded decoder and ``stream_mp4``.

Every test here is marked ``cuda``; ``bench/gpu_check.sh`` runs them (``pytest -m cuda``) on a lent GPU.
Without a device each one still runs its logic on the CPU (streams, events and sync counting do nothing
there), so the suite is known to work before a GPU is lent; only the controls skip, since they show a loss
that only a device can cause. Each test prints its numbers (``pytest -rA`` shows them).

- ``test_chunks_*``: CUDA chunks through ``ChunkedVideoMP4Session`` against the same chunks pushed on the CPU,
  compared as the uint8 frames each ``EntryEncoder.encode`` call receives: exact for rgb24 and for yuv420p's
  Y plane, chroma within 1 level (the 2×2 mean may sum in another order). Each schedule runs with the ring
  and with ``transfer_slots=0``.
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
- ``test_syncs_*``: host synchronizations (``torch.cuda.set_sync_debug_mode("warn")``) during
  ``decode_to_mp4`` of a tiny Wan VAE (latent on the device, and on the host), and during a one-rank NCCL
  ``ShardedWanDecoder`` decode, by file:line and thread. None may run on the event loop thread. A hook on
  ``warnings.showwarning`` records them in whichever thread warns (a self-test warns once on the loop and
  once in a worker thread, to show both are seen).
- ``test_sharded_stream_*``: a one-rank sharded stream of latent pieces (NCCL on CUDA) writes the frames of
  the single process's ``decode_to_mp4`` of the whole latent, with no host synchronization on the loop.
- ``test_wan_*``: chunks concatenated ``torch.equal`` to ``vae.decode`` on the device (Wan 2.1, 2.2); with
  ``enable_tiling`` on a latent of 2×3 tiles the maximum difference is reported (cuDNN may pick other
  algorithms), within 1 uint8 level passes.
- ``test_stream_mp4_*``: a client that leaves after the first bytes leaves no open container and no CUDA
  memory allocated behind it (two runs after a warm-up: a leak grows, a one-off cache does not).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from streamvae import ChunkedVideoMP4Session, decode_to_mp4, quantize_chunk, stream_mp4
from streamvae._codec_options import auto_video_codec
from streamvae._encode import EntryEncoder
from streamvae.models import chunked_decoder
from streamvae.testing import enable_small_tiling, open_containers
from tests import _vaes
from tests._media import DETERMINISTIC_X264, read_mp4

pytestmark = [pytest.mark.cuda, pytest.mark.anyio]

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="needs CUDA: only a device can lose what the control removes"
)

FPS = 16
FAST = {"preset": "ultrafast", "threads": "1"}  # the encode is not what is checked here
TIMEOUT_S = 120  # a hung session fails its test instead of waiting for the hang guard
SLEEP_MS = 25  # how long a delayed stream spins before its work
GATE_MS = 150  # how long a ready event waits behind a busy stream (longer than the pipeline's host steps)
GARBAGE = 0.3  # what a reader that does not wait for the producer's write would see
HEIGHT, WIDTH, BATCH = 96, 128, 2
CHUNK_FRAMES = (1, 4, 4, 4, 4)  # Wan-like: 17 frames, not a multiple of 2 or 4
SYNC_WARNING = "synchronizing CUDA operation"
MARKER = "cuda test capture self-test"
T = TypeVar("T")


@pytest.fixture(autouse=True)
def quiet_device() -> Iterator[None]:
    """Each test leaves a quiet device: the next one's memory and timings are its own (nothing on a CPU)."""
    yield
    if CUDA:
        with contextlib.suppress(Exception):  # a device error is the failing test's, not the next one's
            settle()


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
    """Wait for the device, collect garbage and drop cuBLAS workspaces: allocated memory is only tensors."""
    gc.collect()
    if CUDA:
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()


def allocated() -> int:
    return torch.cuda.memory_allocated(DEVICE) if CUDA else 0


def tiny_wan(version: str) -> nn.Module:
    return (_vaes.tiny_wan21() if version == "2.1" else _vaes.tiny_wan22()).to(DEVICE)


def latent(vae: nn.Module, batch: int, frames: int, h: int, w: int) -> Tensor:
    """The seeded latent of tests/_vaes.py (drawn on the CPU: the same numbers everywhere), on DEVICE."""
    return _vaes.latent(vae, batch, frames, h, w).to(DEVICE)


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


# schedule -> (producer factory, batch_frames)
SCHEDULES: dict[str, tuple[Callable[[], Producer], int]] = {
    "late_producer": (late_producer, 1),
    "reused_memory": (reusing_producer, 2),
    "caller_stream_finish": (finishing_producer, 4),
}
# schedule -> (what its control removes, the producer and the patch without that safeguard)
CONTROLS: dict[str, tuple[str, Callable[[], tuple[Producer, contextlib.AbstractContextManager[Any]]]]] = {
    "late_producer": (
        "ready event on the default stream",
        lambda: (late_producer(control=True), contextlib.nullcontext()),
    ),
    "reused_memory": ("record_stream a no-op", lambda: (reusing_producer(), record_stream_disabled())),
}
_cpu_references: dict[str, list[np.ndarray]] = {}


async def encoder_inputs(
    produce: Producer,
    chunks: list[Tensor],
    *,
    pixel_format: str,
    batch_frames: int,
    transfer_slots: int = 2,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The frames each encoder received while ``produce`` pushed ``chunks``, and the producer's notes."""
    with recording_encoder_inputs() as inputs, anyio.fail_after(TIMEOUT_S):
        async with ChunkedVideoMP4Session(
            value_range=(-1.0, 1.0),
            fps=FPS,
            pixel_format=pixel_format,  # type: ignore[arg-type]
            batch_frames=batch_frames,
            transfer_slots=transfer_slots,
            video_codec_options=FAST,
        ) as session:
            notes = await produce(session, chunks)
    videos = notes.pop("videos")
    assert len(videos) == BATCH and all(videos), (
        f"expected {BATCH} MP4s, got sizes {[len(v) for v in videos]}"
    )
    return inputs.entries(), notes


async def cpu_reference(pixel_format: str) -> list[np.ndarray]:
    """What the encoders receive when the chunks are pushed from the host one by one (once per format)."""
    if pixel_format not in _cpu_references:
        frames, _ = await encoder_inputs(push_all, host_chunks(), pixel_format=pixel_format, batch_frames=1)
        _cpu_references[pixel_format] = frames
    return _cpu_references[pixel_format]


def device_chunks() -> list[Tensor]:
    sources = [chunk.to(DEVICE) for chunk in host_chunks()]
    if CUDA:
        cycles_per_ms()  # calibrated now, not inside a schedule (it synchronizes)
    settle()
    return sources


def noted(notes: dict[str, Any]) -> str:
    return "".join(f", {key} {value}" for key, value in notes.items())


@pytest.mark.parametrize(
    ("anyio_backend", "transfer_slots"),
    [("asyncio", 2), ("trio", 2), ("asyncio", 0)],
    ids=["asyncio-ring", "trio-ring", "asyncio-blocking"],
)
@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
async def test_chunks_on_the_device_reach_the_encoders_as_the_host_push_does(
    schedule: str, pixel_format: str, transfer_slots: int
) -> None:
    make_producer, batch_frames = SCHEDULES[schedule]
    reference = await cpu_reference(pixel_format)
    got, notes = await encoder_inputs(
        make_producer(),
        device_chunks(),
        pixel_format=pixel_format,
        batch_frames=batch_frames,
        transfer_slots=transfer_slots,
    )
    ok, numbers = compare(pixel_format, got, reference)
    print(
        f"{sum(CHUNK_FRAMES)} frames × {BATCH} entries, batch_frames={batch_frames}: {numbers}{noted(notes)}"
    )
    assert ok, numbers + noted(notes)


@needs_cuda
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("pixel_format", ["rgb24", "yuv420p"])
@pytest.mark.parametrize("schedule", list(CONTROLS))
async def test_chunks_control_without_the_safeguard_shows_whether_the_schedule_catches_its_loss(
    schedule: str, pixel_format: str
) -> None:
    """Informational, as a control is: a match means the schedule was too gentle, not that streamvae erred."""
    (_, batch_frames), (what, make) = SCHEDULES[schedule], CONTROLS[schedule]
    reference = await cpu_reference(pixel_format)
    sources = device_chunks()
    produce, patch = make()
    with patch:
        got, notes = await encoder_inputs(
            produce, sources, pixel_format=pixel_format, batch_frames=batch_frames
        )
    matched, numbers = compare(pixel_format, got, reference)
    numbers += noted(notes)
    verdict = f"NOT caught, the schedule is too gentle ({numbers})" if matched else f"caught ({numbers})"
    print(f"control, {what}: {verdict}")


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


@contextlib.contextmanager
def warnings_by_thread() -> Iterator[list[Warned]]:
    """Every warning of every thread while the block runs, with the thread that warned.

    ``warnings.catch_warnings`` only saves and restores the module's state; the hook it restores is what
    records, and it is called in whichever thread warns (worker threads included), unlike ``record=True``
    whose list does not say which thread warned. Entered on the event loop's thread.
    """
    loop = threading.get_ident()
    warned: list[Warned] = []

    def hook(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        text = str(message)
        thread = "event loop" if threading.get_ident() == loop else threading.current_thread().name[:40]
        warned.append(
            Warned(text.splitlines()[0] if text else "", f"{os.path.basename(filename)}:{lineno}", thread)
        )

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        yield warned


async def counting_syncs(main: Callable[[], Awaitable[T]]) -> tuple[T, list[Warned]]:
    """Run ``main`` with every host synchronization warned about, and every warning of every thread kept."""
    with warnings_by_thread() as warned:
        warnings.warn(f"{MARKER} (loop)", stacklevel=1)
        await anyio.to_thread.run_sync(functools.partial(warnings.warn, f"{MARKER} (worker)", stacklevel=1))
        if not CUDA:  # no device to synchronize with: a stand-in shows the report's form in the dry run
            await anyio.to_thread.run_sync(functools.partial(warnings.warn, f"a {SYNC_WARNING} (stand-in)"))
        with anyio.fail_after(TIMEOUT_S), sync_debug_warn():
            result = await main()
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


@pytest.mark.slow  # a few seconds: whole decodes through the encoder, twice
@pytest.mark.parametrize("latent_on_host", [False, True], ids=["device_latent", "host_latent"])
async def test_syncs_decode_to_mp4_never_synchronizes_on_the_event_loop(latent_on_host: bool) -> None:
    vae = tiny_wan("2.1")
    z = latent(vae, 2, 5, 16, 16)
    if latent_on_host:
        z = z.cpu()  # a server that received the latent over the wire: decode_to_mp4 moves it

    def decode() -> Awaitable[list[bytes]]:
        return decode_to_mp4(vae, z, fps=FPS, video_codec_options=FAST)

    await decode()  # warm-up: first kernels, cuDNN and cuBLAS handles, the encoder
    videos, warned = await counting_syncs(decode)
    ok, text = describe_syncs(warned)
    print(f"latent {tuple(z.shape)} on {z.device.type}: {text}")
    assert ok, text
    assert len(videos) == 2 and all(videos)


@contextlib.contextmanager
def group_of_one() -> Iterator[Any]:
    """A process group of this process alone (NCCL on CUDA, else gloo), destroyed after if made here."""
    import torch.distributed as dist

    from streamvae.distributed import init_distributed

    if CUDA and not dist.is_nccl_available():
        pytest.skip("needs CUDA with NCCL: this torch has no NCCL")
    created = not dist.is_initialized()
    device = init_distributed(timeout=timedelta(seconds=60))
    try:
        yield device
    finally:
        if created:
            dist.destroy_process_group()


@pytest.mark.slow  # a few seconds: whole decodes through the encoder, twice
async def test_syncs_sharded_decode_never_synchronizes_on_the_event_loop() -> None:
    import torch.distributed as dist

    from streamvae.distributed import ShardedWanDecoder

    with group_of_one() as device:
        backend_name = str(dist.get_backend())
        vae = tiny_wan("2.1")
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

        videos, warned = await counting_syncs(decode)
        ok, text = describe_syncs(warned)
        print(
            f"{backend_name}, world size {dist.get_world_size()}, chunks equal to unsharded: {equal} "
            f"(max |Δ| {delta:g}); {text}, {decoder.stats.collectives} collectives"
        )
        assert ok, text
        assert len(videos) == 1 and videos[0]


@pytest.mark.slow  # a few seconds: whole decodes through the encoder, twice
async def test_sharded_stream_of_pieces_writes_the_single_process_frames() -> None:
    """A one-rank sharded stream (NCCL on CUDA): pieces pushed through ``open_latent_stream`` give the frames
    of ``decode_to_mp4`` of the concatenated latent in one process (within 1 uint8 level: cuDNN may sum a
    strip differently), with no host synchronization on the event loop thread."""
    import torch.distributed as dist

    from streamvae import open_latent_stream
    from streamvae.distributed import sharded_decoder

    with group_of_one() as device:
        backend_name = str(dist.get_backend())
        vae = tiny_wan("2.1")
        z = latent(vae, 1, 5, 16, 16).to(device)
        decoder = sharded_decoder(vae, shard="height")  # a group of one: one strip, every collective run

        async def stream() -> list[bytes]:
            async with open_latent_stream(decoder, fps=FPS, video_codec_options=DETERMINISTIC_X264) as opened:
                for piece in (z[:, :, :2], z[:, :, 2:3], z[:, :, 3:]):
                    await opened.push_latents(piece)
                return await opened.finish()

        single = await decode_to_mp4(vae, z, fps=FPS, video_codec_options=DETERMINISTIC_X264)
        videos, warned = await counting_syncs(stream)
        ok, text = describe_syncs(warned)
        frames = [read_mp4(videos[0]).frames, read_mp4(single[0]).frames]
        same_shape = frames[0].shape == frames[1].shape
        levels = int(np.abs(frames[0].astype(int) - frames[1].astype(int)).max()) if same_shape else -1
        print(
            f"{backend_name}, world size {dist.get_world_size()}: {text}, frames {frames[0].shape[0]}, "
            f"bytes equal {videos == single}, max level Δ {levels}, {decoder.stats.collectives} collectives"
        )
        assert ok, text
        assert same_shape and 0 <= levels <= 1, f"shapes {[f.shape for f in frames]}, level Δ {levels}"


# --------------------------------------------------------------------------------------- Wan exactness


def chunks_vs_decode(vae: Any, z: Tensor) -> tuple[bool, float, int]:
    """(torch.equal, max |Δ|, max uint8 levels apart) of the concatenated chunks and ``vae.decode``."""
    chunks: list[Tensor] = []
    chunked_decoder(vae).decode_with_chunks(z, on_chunk=chunks.append)
    with torch.no_grad():
        reference = vae.decode(z).sample
    streamed = torch.cat(chunks, dim=2)
    assert streamed.shape == reference.shape, (
        f"chunks make {tuple(streamed.shape)}, vae.decode {tuple(reference.shape)}"
    )
    delta = float((streamed - reference).abs().max())
    levels = int(
        (quantize_chunk(streamed, (-1, 1)).int() - quantize_chunk(reference, (-1, 1)).int()).abs().max()
    )
    return torch.equal(streamed, reference), delta, levels


@pytest.mark.parametrize(("version", "batch"), [("2.1", 2), ("2.2", 1)])
def test_wan_chunks_equal_vae_decode_on_the_device(version: str, batch: int) -> None:
    vae = tiny_wan(version)
    z = latent(vae, batch, 5, 8, 8)
    equal, delta, levels = chunks_vs_decode(vae, z)
    print(f"Wan {version} {tuple(z.shape)}: equal {equal}, max |Δ| {delta:g}, uint8 Δ {levels}")
    assert equal, f"max |Δ| {delta:g}, uint8 Δ {levels}"


@pytest.mark.parametrize(("version", "batch"), [("2.1", 2), ("2.2", 1)])
def test_wan_tiled_chunks_are_within_one_level_of_vae_decode(version: str, batch: int) -> None:
    vae = tiny_wan(version)
    enable_small_tiling(vae)
    z = latent(vae, batch, 5, 6, 7)  # 2×3 tiles
    equal, delta, levels = chunks_vs_decode(vae, z)
    print(f"Wan {version} {tuple(z.shape)} tiled: equal {equal}, max |Δ| {delta:g}, uint8 Δ {levels}")
    assert levels <= 1, f"max |Δ| {delta:g}, uint8 Δ {levels}"


# ------------------------------------------------------------------------------------ a client that leaves


@pytest.mark.slow  # a few seconds: whole decodes through the encoder, twice
async def test_stream_mp4_client_that_leaves_early_leaves_no_container_or_device_memory() -> None:
    vae = tiny_wan("2.1")
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

    await leave()  # warm-up: worker threads, their handles and the encoder
    settle()
    before = allocated()
    runs = []
    for _ in range(2):
        received, pushed = await leave()
        settle()
        runs.append((received, pushed, allocated() - before, open_containers()))
    text = f"{total} frames: " + ", ".join(
        f"left after {r} B at frame {p}, CUDA memory {grew:+d} B, open containers {left}"
        for r, p, grew, left in runs
    )
    print(text)
    assert all(r > 0 and grew == 0 and left == 0 for r, _, grew, left in runs), text


def test_codec_auto_chooses_an_encoder_here() -> None:
    """Informational: what ``video_codec="auto"`` chooses here (no NVENC block on H100/H200/A100: libx264)."""
    started = time.perf_counter()
    chosen = auto_video_codec()
    print(f"auto chose {chosen} (probe {1000 * (time.perf_counter() - started):.1f} ms)")
    assert chosen
