"""Every async test runs on asyncio and trio (anyio's pytest plugin, parametrized by ``anyio_backend``)."""

from __future__ import annotations

import pytest

from tests._adapters import one_torch_thread  # noqa: F401  (a fixture the adapter tests share)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
