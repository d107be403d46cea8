"""Leak checks: what a session must leave as it found it, counted before and after.

:func:`open_containers` counts the MP4 containers open in this process (it must come back to its value
before a session once the session is over); :func:`foreign_threads` names the threads a session could have
left behind.
"""

from __future__ import annotations

import threading

from streamvae._encode import open_containers

__all__ = ["foreign_threads", "open_containers"]


def foreign_threads() -> set[str]:
    """Names of the live threads that are neither the main thread nor an idle worker of anyio's or trio's
    pools (those idle workers linger about ten seconds after use): compare before and after a session to
    check that it left no thread behind."""
    return {
        thread.name
        for thread in threading.enumerate()
        if thread is not threading.main_thread()
        and not thread.name.startswith(("AnyIO worker thread", "Trio thread", "asyncio_"))
    }
