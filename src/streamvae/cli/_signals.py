"""SIGTERM stops a command as Ctrl-C does: the decode cancelled, its partial outputs removed, one line.

Python's default for SIGTERM ends the process on the spot, leaving a ``<name>.part`` file beside each
output; a service manager, ``kill`` and ``timeout`` all stop a process with it. Outside an event loop
(loading the VAE, reading the latents) the handler of :func:`sigterm_as_ctrl_c` raises :class:`Terminated`
where the main thread is, as Python's own handler raises KeyboardInterrupt for Ctrl-C. Inside the decode's
event loop :func:`until_sigterm` receives it instead, through the loop (asyncio's and trio's own signal
handling), and cancels the decode there: an exception raised by a handler in the middle of the loop's own
code, as trio's run with SIGINT ignored would get, could leave the loop broken and the files behind.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

import anyio

__all__ = ["TERMINATED_STATUS", "Terminated", "sigterm_as_ctrl_c", "until_sigterm"]

#: the exit status of a run stopped by SIGTERM: 128 + the signal's number, as shells report it
TERMINATED_STATUS = 128 + int(signal.SIGTERM)

T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped the command (a KeyboardInterrupt, so that every ``except Exception`` lets it by,
    as it lets Ctrl-C by)."""


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread (a block run in another
    thread, which may set no handler, keeps the default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


async def until_sigterm(work: Callable[[], Awaitable[T]]) -> T:
    """``await work()``; a SIGTERM meanwhile cancels it and, once it has stopped (its cleanup done, as on
    Ctrl-C), raises :class:`Terminated`."""
    result: list[T] = []
    terminated = False
    try:
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    nonlocal terminated
                    async for _ in signals:
                        terminated = True
                        group.cancel_scope.cancel()
                        return

                group.start_soon(watch)
                result.append(await work())
                group.cancel_scope.cancel()
    except BaseExceptionGroup as errors:
        # The work's own error, as it raised it (the task group wraps it): the CLI's one line, or a bug's
        # traceback, is the error's, not a group's.
        from streamvae.cli._runner import unwrap  # torch and PyAV: not before a decode needs them

        raise unwrap(errors) from None
    if terminated:
        raise Terminated
    return result[0]
