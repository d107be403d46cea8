"""``serve``: the app under uvicorn in a process of its own, with its logging set up and the allocator
tuned for a long run."""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from streamvae.server._app import create_app


def serve(*, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", **app_options: Any) -> None:
    """Run :func:`create_app`'s app under uvicorn until interrupted (``streamvae serve``).

    ``serve`` owns its process, so it configures the process's logging: uvicorn's, and the ``streamvae``
    loggers' on uvicorn's stderr handler at ``log_level``, so that each request's statistics line
    (``streamvae.server``, info) appears beside uvicorn's own. :func:`create_app` logs without configuring
    anything; mounted elsewhere, the app's lines go wherever that entry point's logging sends them.

    It also tunes the C allocator for a server that runs for days (glibc only; on other C libraries it
    changes nothing): after each ``/video.mp4`` response ends it calls ``malloc_trim(0)`` in a worker
    thread. Without it glibc keeps the pages a decode freed in the arenas of the worker threads that freed
    them, and RSS creeps up for hundreds of requests; with it the process hands them back to the system
    (measured: docs/benchmarks.md, "Soak"). It is not a leak fix, and :func:`create_app` does none of it:
    the allocator is the process's, so only its entry point may tune it — do the same in yours if you
    mount the app elsewhere.
    """
    import uvicorn

    app: ASGIApp = create_app(**app_options)
    trim = _glibc_malloc_trim()
    if trim is not None:
        app = _TrimAfterVideo(app, trim)
    uvicorn.run(app, host=host, port=port, log_level=log_level, log_config=_log_config(log_level))


def _log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging config, plus the ``streamvae`` loggers on its stderr handler at ``log_level``."""
    from uvicorn.config import LOG_LEVELS, LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    level = LOG_LEVELS.get(log_level.lower(), log_level)  # uvicorn's names ("trace" too), or a number
    config["loggers"]["streamvae"] = {"handlers": ["default"], "level": level, "propagate": False}
    return config


def _glibc_malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library is another (musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols
        if not hasattr(libc, "gnu_get_libc_version"):  # only glibc has it
            return None
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return partial(trim, 0)


class _TrimAfterVideo:
    """ASGI middleware of :func:`serve`: trims the allocator after each ``/video.mp4`` response."""

    def __init__(self, app: ASGIApp, trim: Callable[[], object]) -> None:
        self.app = app
        self.trim = trim
        self._limiter: anyio.CapacityLimiter | None = None  # made on the serving loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http" and scope["path"].endswith("/video.mp4"):
                with anyio.CancelScope(shield=True):
                    await self._trim()

    async def _trim(self) -> None:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        if self._limiter.borrowed_tokens:
            return  # a trim is running: it covers every arena, this request's too
        await anyio.to_thread.run_sync(self.trim, limiter=self._limiter)
