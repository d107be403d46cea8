"""The synthetic video the benchmarks push: smooth colour waves that move, in [-1, 1]."""

from __future__ import annotations

import torch


def moving_waves(frames: int, height: int, width: int) -> torch.Tensor:
    """[1, 3, frames, height, width] float32 in [-1, 1]: three moving waves, one per channel."""
    t = torch.arange(frames, dtype=torch.float32)[:, None, None]
    y = torch.linspace(-1, 1, height)[None, :, None]
    x = torch.linspace(-1, 1, width)[None, None, :]
    return torch.stack(
        [
            torch.sin(3 * x + 0.3 * t + y),
            torch.cos(2 * y - 0.2 * t) * torch.cos(2 * x),
            torch.sin(5 * (x * x + y * y) - 0.25 * t),
        ]
    )[None]
