"""Every async test runs on asyncio and trio (anyio's pytest plugin, parametrized by ``anyio_backend``)."""

from __future__ import annotations

import pytest
import torch

from tests._adapters import one_torch_thread  # noqa: F401  (a fixture the adapter tests share)


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
