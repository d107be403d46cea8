"""Spies on the parts of a pipeline that tests watch without changing what they do."""

from __future__ import annotations

from typing import Any

import torch

from streamvae import PinnedChunkRing


def count_transfers(ring: PinnedChunkRing) -> list[int]:
    """Make ``ring`` record each transfer's frame count (its groups, in order) into the returned list."""
    transferred: list[int] = []
    transfer = ring.transfer

    async def counting_transfer(frames: torch.Tensor, **kwargs: Any) -> Any:
        transferred.append(frames.shape[1])
        return await transfer(frames, **kwargs)

    ring.transfer = counting_transfer  # type: ignore[method-assign]
    return transferred
