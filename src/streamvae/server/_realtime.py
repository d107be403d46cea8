"""Real-time mode (``realtime=1``): the request's latent reaches the decode one latent frame a step.

A seeded stand-in generator emits the latent step by step, ``delay`` seconds apart, as an autoregressive
model would, and :func:`streamvae.open_latent_stream` decodes each step while the next is generated: the
client plays the video while it is still being generated.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.datastructures import QueryParams
from torch import Tensor

from streamvae._checks import check_latents
from streamvae._latent_stream import open_latent_stream
from streamvae._options import SessionOptions
from streamvae._session import ChunkedVideoMP4Session
from streamvae._sinks import MP4ByteStream

#: seconds a stand-in step may take at most: a longer one is a slow client's way to hold a slot
MAX_DELAY = 2.0
#: seconds a step takes when the query names no ``delay``
DEFAULT_DELAY = 0.1
#: a plain decimal: no sign, exponent, ``nan`` or ``inf`` (which ``float()`` would take)
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


def parse_realtime(query: QueryParams) -> tuple[bool, float]:
    """``realtime`` (``0`` or ``1``, default 0) and ``delay`` (0 … :data:`MAX_DELAY` seconds), or a
    ValueError (a 400) naming the value."""
    realtime = query.get("realtime", "0")
    if realtime not in ("0", "1"):
        raise ValueError(f"realtime must be 0 or 1, got {realtime[:24]!r}")
    text = query.get("delay", str(DEFAULT_DELAY))
    shown = text if len(text) <= 24 else text[:24] + "…"
    if len(text) > 24 or not _DECIMAL.fullmatch(text):
        raise ValueError(f"delay must be a number of seconds, got {shown!r}")
    delay = float(text)
    if not 0 <= delay <= MAX_DELAY:
        raise ValueError(f"delay must be at least 0 and at most {MAX_DELAY:g} seconds, got {shown}")
    return realtime == "1", delay


@asynccontextmanager
async def realtime_mp4(
    vae: Any,
    z: Tensor,
    delay: float,
    decode_limiter: anyio.CapacityLimiter,
    *,
    options: SessionOptions,
    on_session: Callable[[ChunkedVideoMP4Session], None],
) -> AsyncIterator[MP4ByteStream]:
    """The fragmented MP4 of ``z`` (batch 1), fed to the decode one latent frame ``[1, C, 1, H, W]`` a
    step, each step after ``delay`` seconds (the stand-in model at work).

    The feed is the session's producer, so its error (a decode's, a bad step's) reaches the byte stream
    unwrapped. Leaving the block early stops the feed at once and aborts the stream, as
    :func:`streamvae.stream_mp4` does.
    """
    # What the app's latents= returned, checked as a latent first: a 4-D one would read as a batch.
    check_latents(z, None, owner="create_app", name="the latent of latents=")
    if z.shape[0] != 1:
        raise ValueError(
            f"create_app: the latent of latents= must be of batch 1 in real-time mode (realtime=1), "
            f"got shape {tuple(z.shape)}"
        )
    async with open_latent_stream(vae, decode_limiter=decode_limiter, options=options) as stream:
        on_session(stream.session)
        video = stream.open_stream(0)
        feed_scope = anyio.CancelScope()

        async def feed() -> None:
            with feed_scope:
                for step in range(z.shape[2]):
                    await anyio.sleep(delay)
                    await stream.push_latents(z[:, :, step : step + 1])
                await stream.finish()

        stream.session.start_producer(feed)
        try:
            yield video
        finally:
            feed_scope.cancel()  # a no-op once the feed is done; stops it if the client left early
            await video.aclose()
