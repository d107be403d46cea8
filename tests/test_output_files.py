"""Output files: an entry's path holds the complete MP4 or what it held before, never a partial file."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from streamvae import ChunkedVideoMP4Session
from streamvae.testing import open_containers
from tests._media import DETERMINISTIC_X264, REFUSED_AT_OPEN, read_mp4, wan_like_chunks

ROOT = Path(__file__).parents[1]
PINNED = DETERMINISTIC_X264  # byte-identical MP4s for identical frames
# Emits packets from the first frame: with a keyframe every 2 frames, bytes reach the disk at once.
LOW_LATENCY = {"threads": "1", "preset": "ultrafast", "tune": "zerolatency"}
EARLIER = b"an earlier render, kept byte for byte"
SIZE = {"height": 32, "width": 48}


def chunks(latent_frames: int = 3) -> list[torch.Tensor]:
    return wan_like_chunks(latent_frames, **SIZE)  # 1 + 4 (n - 1) frames


async def render(files: Sequence[Any], *, latent_frames: int = 3, **options: Any) -> list[bytes]:
    options.setdefault("video_codec_options", PINNED)
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, output_files=files, **options) as session:
        for chunk in chunks(latent_frames):
            await session.push(chunk)
        return await session.finish()


def earlier_render(tmp_path: Path, mode: int = 0o644) -> Path:
    path = tmp_path / "out.mp4"
    path.write_bytes(EARLIER)
    path.chmod(mode)
    return path


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def make_device(path: Path, minor: int) -> Path:
    """A private character device node in ``tmp_path``: minor 3 takes every write, minor 7 (the
    memory device that is always full) fails every write with ENOSPC."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    return path


# ------------------------------------------------------------------------------------------ regular files


@pytest.mark.anyio
@pytest.mark.parametrize("output", ["mp4", "fragmented"])
async def test_a_new_file_is_complete_and_gets_the_mode_of_a_new_file(output: str, tmp_path: Path) -> None:
    path = tmp_path / "out.mp4"
    with umask(0o027):
        (video,) = await render([path], output=output, latent_frames=4)
    assert path.read_bytes() == video
    assert read_mp4(path.read_bytes()).frames.shape == (13, 32, 48, 3)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~0o027
    assert listing(tmp_path) == ["out.mp4"]  # no temporary file left


@pytest.mark.anyio
async def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    path = earlier_render(tmp_path, mode=0o604)
    (video,) = await render([path])
    assert path.read_bytes() == video
    assert read_mp4(video).frames.shape[0] == 9
    assert stat.S_IMODE(path.stat().st_mode) == 0o604
    assert listing(tmp_path) == ["out.mp4"]


def progressive_session(path: Path) -> ChunkedVideoMP4Session:
    """A session that writes a fragment every two frames to ``path``, with no encoder delay."""
    return ChunkedVideoMP4Session(
        value_range=(-1, 1),
        fps=16,
        output="fragmented",
        keyframe_interval=2,
        output_files=[path],
        video_codec_options=LOW_LATENCY,
    )


@pytest.mark.anyio
async def test_bytes_reach_a_temporary_file_beside_the_target_while_the_decode_runs(tmp_path: Path) -> None:
    path = earlier_render(tmp_path)
    partial = tmp_path / "out.mp4.part"
    async with progressive_session(path) as session:
        stream = session.open_stream(0, max_buffered=64)
        for chunk in chunks(4):
            await session.push(chunk)
        first = await anext(stream)  # written to the file before it was handed to the stream
        assert partial.read_bytes()[: len(first)] == first
        assert path.read_bytes() == EARLIER  # the target changes only when the MP4 is complete
        received = [first]
        async with anyio.create_task_group() as group:

            async def read_rest() -> None:
                received.extend([data async for data in stream])

            group.start_soon(read_rest)
            await session.finish()
    assert path.read_bytes() == b"".join(received)
    assert read_mp4(path.read_bytes()).frames.shape[0] == 13
    assert listing(tmp_path) == ["out.mp4"]


@pytest.mark.anyio
async def test_a_temporary_name_that_exists_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "out.mp4"
    theirs = tmp_path / "out.mp4.part"
    theirs.write_bytes(b"another program's file")
    (video,) = await render([path])
    assert path.read_bytes() == video
    assert theirs.read_bytes() == b"another program's file"
    assert listing(tmp_path) == ["out.mp4", "out.mp4.part"]


@pytest.mark.anyio
async def test_a_symlinked_path_keeps_its_link_and_the_file_it_points_to_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "renders").mkdir()
    real = earlier_render(tmp_path / "renders")
    link = tmp_path / "latest.mp4"
    link.symlink_to(real)
    (video,) = await render([link])
    assert link.is_symlink() and link.resolve() == real
    assert real.read_bytes() == video
    assert listing(tmp_path / "renders") == ["out.mp4"]


# ----------------------------------------------------------------------------------------------- failures


class BodyError(Exception):
    pass


@pytest.mark.anyio
@pytest.mark.parametrize("output", ["mp4", "fragmented"])
@pytest.mark.parametrize("failure", ["codec option", "error in the block"])
async def test_a_failed_session_leaves_the_earlier_file_byte_for_byte(
    output: str, failure: str, tmp_path: Path
) -> None:
    path = earlier_render(tmp_path, mode=0o600)
    if failure == "codec option":
        expected: type[Exception] = ValueError  # x264 refuses the crop when it opens
        options = {"threads": "1", **REFUSED_AT_OPEN}
    else:
        expected, options = BodyError, LOW_LATENCY
    with pytest.raises(expected):
        async with ChunkedVideoMP4Session(
            value_range=(-1, 1),
            fps=16,
            output=output,
            keyframe_interval=2,
            output_files=[path],
            video_codec_options=options,
        ) as session:
            for chunk in chunks(4):
                await session.push(chunk)
            if failure == "error in the block":
                raise BodyError("the producer failed")
            await session.finish()
    assert path.read_bytes() == EARLIER
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert listing(tmp_path) == ["out.mp4"]
    assert open_containers() == 0


@pytest.mark.anyio
async def test_a_cancelled_session_leaves_the_earlier_file_and_no_temporary_file(tmp_path: Path) -> None:
    path = earlier_render(tmp_path)
    with anyio.CancelScope() as scope:
        async with progressive_session(path) as session:
            stream = session.open_stream(0)
            for chunk in chunks(2):
                await session.push(chunk)
            first = await anext(stream)
            assert (tmp_path / "out.mp4.part").stat().st_size >= len(first)  # a partial MP4 on disk
            scope.cancel()
            await session.finish()
    assert scope.cancelled_caught
    assert path.read_bytes() == EARLIER
    assert listing(tmp_path) == ["out.mp4"]


# A child process, so that RLIMIT_FSIZE (and SIGXFSZ ignored: the write fails with EFBIG) stays there.
FILE_SIZE_LIMIT_SCRIPT = """
import errno, json, os, resource, signal, sys
import anyio
from streamvae import ChunkedVideoMP4Session
from tests._media import DETERMINISTIC_X264, wan_like_chunks

path, output = sys.argv[1], sys.argv[2]

async def render(files):
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, output=output, keyframe_interval=2, output_files=files,
        video_codec_options=DETERMINISTIC_X264,
    ) as session:
        for chunk in wan_like_chunks(6, height=32, width=48):
            await session.push(chunk)
        stage = "finish"
        try:
            await session.finish()
        except OSError as error:
            return {"stage": stage, "errno": error.errno}
    return {"stage": "done"}

async def size():
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, output=output, keyframe_interval=2,
        video_codec_options=DETERMINISTIC_X264,
    ) as session:
        for chunk in wan_like_chunks(6, height=32, width=48):
            await session.push(chunk)
        return len((await session.finish())[0])

limit = anyio.run(size) - 1  # byte-identical output (DETERMINISTIC_X264): every write fits but the last one
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
print(json.dumps({"limit": limit, **anyio.run(render, [path])}))
"""


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
def test_a_file_size_limit_hit_by_the_last_write_leaves_no_partial_file(output: str, tmp_path: Path) -> None:
    path = earlier_render(tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT_SCRIPT, str(path), output],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    report = json.loads(child.stdout.splitlines()[-1])
    # Everything but the final write fitted: the failure is the final flush, inside finish().
    assert report["stage"] == "finish" and report["errno"] == errno.EFBIG, report
    assert report["limit"] > len(EARLIER)
    assert path.read_bytes() == EARLIER
    assert listing(tmp_path) == ["out.mp4"]


# --------------------------------------------------------------------------------------- devices and FIFOs


@pytest.mark.anyio
async def test_a_character_device_is_written_directly_and_left_in_place(tmp_path: Path) -> None:
    null = make_device(tmp_path / "null", minor=3)
    (video,) = await render([null])
    assert read_mp4(video).frames.shape[0] == 9
    assert stat.S_ISCHR(null.stat().st_mode)  # written through, not replaced by a regular file
    assert listing(tmp_path) == ["null"]


@pytest.mark.anyio
@pytest.mark.parametrize("output", ["mp4", "fragmented"])
async def test_a_full_device_raises_enospc_and_stays(output: str, tmp_path: Path) -> None:
    full = make_device(tmp_path / "full", minor=7)
    with pytest.raises(OSError) as raised:
        await render([full], output=output)
    assert raised.value.errno == errno.ENOSPC
    assert stat.S_ISCHR(full.stat().st_mode) and full.stat().st_rdev == os.makedev(1, 7)
    assert listing(tmp_path) == ["full"]
    assert open_containers() == 0


@pytest.mark.anyio
async def test_a_fifo_is_opened_only_when_the_first_bytes_are_ready(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # No reader yet: a constructor that opened the FIFO for writing would wait here forever.
    session = ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=16, output="fragmented", output_files=[fifo], video_codec_options=PINNED
    )
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    try:
        async with session:
            for chunk in chunks(4):
                await session.push(chunk)
            (video,) = await session.finish()
    finally:
        await anyio.to_thread.run_sync(reader.join)
    assert received == [video]
    assert read_mp4(video).frames.shape[0] == 13
    assert stat.S_ISFIFO(fifo.stat().st_mode)


# ------------------------------------------------------------------------------------- constructor checks


@pytest.mark.parametrize(
    ("where", "error", "code"),
    [
        ("a directory", IsADirectoryError, errno.EISDIR),
        ("missing/out.mp4", FileNotFoundError, errno.ENOENT),
        ("a file/out.mp4", NotADirectoryError, errno.ENOTDIR),
    ],
)
def test_a_path_that_cannot_be_opened_fails_in_the_constructor(
    where: str, error: type[OSError], code: int, tmp_path: Path
) -> None:
    (tmp_path / "a directory").mkdir()
    (tmp_path / "a file").write_bytes(b"not a directory")
    before = listing(tmp_path)
    path = tmp_path / where
    with pytest.raises(error) as raised:
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, output_files=[tmp_path / "ok.mp4", path])
    assert raised.value.errno == code and raised.value.filename == str(path)
    assert listing(tmp_path) == before  # the check left nothing behind
    assert listing(tmp_path / "a directory") == []


def test_two_entries_with_the_same_file_are_a_value_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"output_files\[0\] \('a.mp4'\) and output_files\[2\] \('a.mp4'\)"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, output_files=["a.mp4", "b.mp4", "./a.mp4"])
    (tmp_path / "link.mp4").symlink_to(tmp_path / "b.mp4")
    with pytest.raises(ValueError, match="same file"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, output_files=["b.mp4", tmp_path / "link.mp4"])
    assert listing(tmp_path) == ["link.mp4"]


@pytest.mark.parametrize("single", ["out.mp4", b"out.mp4", Path("out.mp4")])
def test_a_single_path_is_a_value_error(single: Any) -> None:
    with pytest.raises(ValueError, match="sequence with one path per batch entry"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, output_files=single)


@pytest.mark.parametrize("element", [b"out.mp4", 3, None])
def test_a_path_that_is_not_str_or_pathlike_is_a_value_error(element: Any) -> None:
    with pytest.raises(ValueError, match=r"output_files\[0\] must be a str or os.PathLike"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, output_files=[element])
