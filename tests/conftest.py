"""Every async test runs on asyncio and trio (anyio's pytest plugin, parametrized by ``anyio_backend``).

The fixtures several test modules share are written beside their helpers (tests/_browser.py,
tests/_websocket.py) and imported here, so pytest finds them for every module.
"""

from __future__ import annotations

import pytest
import torch

from tests._browser import chromium_fixture  # noqa: F401  (the browser tests' fixture chromium)
from tests._websocket import (  # noqa: F401  (fixtures the WebSocket tests share: vae, no_leaks)
    demo_vae_fixture,
    no_leaks_fixture,
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_everywhere() -> None:
    """One intra-op torch thread for the whole run, set before any worker thread exists.

    A CPU convolution's result can change in the last bit with the number of threads that reduce it, and a
    thread keeps the count it started with: a decode in a worker thread is compared bit for bit with
    ``vae.decode`` on the main thread only if both use the same count. (Tiny convolutions are also faster
    on one thread on these 2-core machines.)
    """
    torch.set_num_threads(1)
