"""Running one decode into its output files, timed, with a progress bar: :func:`run_decode`."""

from __future__ import annotations

import dataclasses
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import av
from torch import Tensor

from streamvae import MP4ByteStream, SessionOptions
from streamvae._decode import open_decode
from streamvae.cli._progress import progress_reporter


@dataclass
class DecodeJob:
    """One decode the command runs: what to decode, where the MP4s go, how to encode them."""

    vae: Any
    latents: Tensor
    outputs: list[Path]
    frames: int | None  # expected frames per entry, when the VAE's temporal scale is known
    options: SessionOptions  # checked when the job was built; the runner adds the output files


@dataclass
class DecodeSummary:
    """What the summary line reports."""

    frames: int  # per entry
    width: int | None  # None if the MP4's header could not be read back
    height: int | None
    seconds: float
    first_byte_seconds: float | None
    bytes_out: int
    outputs: list[Path]
    encoder_name: str | None = None  # the video encoder that opened (what video_codec="auto" chose)

    def line(self) -> str:
        names = ", ".join(str(p) for p in self.outputs)
        first = "-" if self.first_byte_seconds is None else f"{self.first_byte_seconds:.2f} s"
        size = "" if self.width is None else f" {self.width}×{self.height}"
        encoder = "" if self.encoder_name is None else f" ({self.encoder_name})"
        return (
            f"{names}: {self.frames} frames{size} in {self.seconds:.2f} s "
            f"({self.frames / self.seconds:.1f} fps), first byte after {first}, "
            f"{_human_bytes(self.bytes_out)}{encoder}"
        )


def _human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


async def run_decode(job: DecodeJob, *, progress: bool = True) -> DecodeSummary:
    """Decode ``job`` into its output files, with a progress bar.

    The session writes the files (``output_files``): each appears at its path, complete, when its MP4 is;
    a path that cannot be written raises before anything is decoded or drawn. The byte streams are read
    alongside only to keep the decode going and to time the first byte.
    """
    options = dataclasses.replace(job.options, output_files=tuple(job.outputs))
    started = time.perf_counter()
    first_byte: list[float] = []
    frame_size: list[tuple[int, int]] = []
    reporter = progress_reporter(job.frames) if progress else None

    async def drain(stream: MP4ByteStream) -> None:
        head = bytearray()  # entry 0's first bytes, until its header (the frame size) can be read
        async for data in stream:
            if not first_byte:
                first_byte.append(time.perf_counter() - started)
            if stream.entry == 0 and not frame_size and len(head) < _HEADER_LIMIT:
                head += data
                size = _frame_size(bytes(head))
                if size is not None:
                    frame_size.append(size)

    try:
        async with anyio.create_task_group() as group:
            async with (
                open_decode(job.vae, job.latents, decode_limiter=None, options=options) as (session, streams),
                anyio.create_task_group() as drains,  # every entry at once: they share one pipeline
            ):
                if reporter is not None:  # only now: a session the options failed to make shows no bar
                    group.start_soon(reporter.run, [session])
                for stream in streams:
                    drains.start_soon(drain, stream)
            seconds = time.perf_counter() - started
            if reporter is not None:
                reporter.stop(session)
            group.cancel_scope.cancel()
    except BaseExceptionGroup as errors:
        raise unwrap(errors) from None
    width, height = frame_size[0] if frame_size else (None, None)
    return DecodeSummary(
        frames=session.frames_pushed,
        width=width,
        height=height,
        seconds=seconds,
        first_byte_seconds=first_byte[0] if first_byte else None,
        bytes_out=session.bytes_out,
        outputs=job.outputs,
        encoder_name=session.encoder_name,
    )


def error_leaves(errors: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The distinct errors inside ``errors`` and its nested groups."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [errors]
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        elif not any(error is seen for seen in leaves):
            leaves.append(error)
    return leaves


def unwrap(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error behind ``errors`` (every reader of a failed session raises the same one)."""
    leaves = error_leaves(errors)
    return leaves[0] if len(leaves) == 1 else errors


# The header of a fragmented MP4 comes with its first fragment; a plain MP4 arrives whole.
_HEADER_LIMIT = 1 << 22


def _frame_size(head: bytes) -> tuple[int, int] | None:
    """Width and height of the video in an MP4's first bytes (as written, after any crop), if it has them."""
    try:
        with av.open(io.BytesIO(head), mode="r") as container:
            if not container.streams.video:
                return None
            context = container.streams.video[0].codec_context
            return context.width, context.height
    except av.error.FFmpegError:  # not enough of the file yet
        return None
