"""A reader is always told: a session or latent stream that fails at its door (before its pipeline starts)
fails every byte stream opened on it with the same error, as a failure later in the decode does, so a task
group that holds a reader never waits forever."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
import torch

from streamvae import ChunkedVideoMP4Session, MP4ByteStream, SessionClosedError, open_latent_stream
from tests._vaes import tiny_wan21

pytestmark = pytest.mark.anyio

HANG_GUARD = 60  # seconds: the failure is a hang, so a generous bound turns it into a failed test


async def read_and_push(stream: MP4ByteStream, push: Callable[[], Awaitable[object]]) -> list[BaseException]:
    """Read ``stream`` in one task and run ``push`` in another; what each raised (a quiet end: nothing)."""
    raised: list[BaseException] = []

    async def read() -> None:
        try:
            async for _ in stream:
                pass
        except Exception as error:
            raised.append(error)

    async def pusher() -> None:
        try:
            await push()
        except Exception as error:
            raised.append(error)

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(pusher)
    return raised


async def test_a_latent_stream_refused_at_its_door_fails_the_reader_of_an_entry_it_will_not_have() -> None:
    vae = tiny_wan21()
    z = torch.randn(1, 16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    async with open_latent_stream(vae, fps=16, output="fragmented") as stream:
        entry = stream.open_stream(1)  # the latent has batch 1: entry 1 does not exist

        async def push() -> None:
            for t in range(3):
                await stream.push_latents(z[:, :, t : t + 1])
            await stream.finish()

        raised = await read_and_push(entry, push)
        assert len(raised) == 2 and raised[0] is raised[1]  # the pusher and the reader: the same error
        assert isinstance(raised[0], ValueError) and "entry 1" in str(raised[0])
        with pytest.raises(ValueError, match="entry 1"):
            await stream.push_latents(z[:, :, :1])  # the stream stays failed with it
    with pytest.raises(SessionClosedError):
        stream.open_stream(0)


async def test_a_session_refused_at_its_first_chunk_fails_its_readers() -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=8, output="fragmented") as session:
        entry = session.open_stream(2)
        raised = await read_and_push(entry, lambda: session.push(torch.zeros(2, 3, 1, 16, 16)))
        assert len(raised) == 2 and raised[0] is raised[1]
        assert isinstance(raised[0], ValueError) and "entry 2" in str(raised[0])


async def test_a_session_finished_before_any_chunk_fails_its_readers() -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=8, output="fragmented") as session:
        entry = session.open_stream(0)
        raised = await read_and_push(entry, session.finish)
        assert len(raised) == 2 and raised[0] is raised[1]
        assert isinstance(raised[0], SessionClosedError) and "before any chunk" in str(raised[0])


async def test_without_readers_a_refused_first_chunk_leaves_the_session_open() -> None:
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=8, audio_waveforms=[None], audio_sample_rate=8000
    ) as session:
        with pytest.raises(ValueError, match="audio_waveforms has 1 entries but the batch has 2"):
            await session.push(torch.zeros(2, 3, 1, 16, 16))
        await session.push(torch.zeros(1, 3, 1, 16, 16))  # a chunk that fits
        (video,) = await session.finish()
    assert video
