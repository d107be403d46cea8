"""The strip layout: which latent rows (or columns) each rank decodes, and how strips become frames again.

Pure arithmetic over shapes and tensors, no process group: every rank computes the same plan from the
latent's size and the world size, so no collective is needed to agree on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ShardAxis = Literal["auto", "height", "width"]
"""The latent axis split across the ranks, or ``"auto"``: chosen per decode from the latent's size."""

AXIS_DIM: dict[str, int] = {"height": -2, "width": -1}  # the same for BCTHW activations and (B·T)CHW ones


@dataclass(frozen=True)
class StripLayout:
    """Which latent rows (or columns) each rank decodes; the same plan on every rank."""

    axis: int
    bounds: tuple[tuple[int, int], ...]  # [start, stop) of each strip, in order
    rank: int

    @classmethod
    def plan(cls, rows: int, world_size: int, rank: int, axis: int) -> StripLayout:
        """Split ``rows`` into ``min(rows, world_size)`` strips whose sizes differ by at most one.

        With fewer rows than ranks, strips are one row each and rank r decodes strip r % len(strips):
        every rank still has a strip, so every rank runs every collective.
        """
        count = min(rows, world_size)
        base, extra = divmod(rows, count)
        bounds, start = [], 0
        for s in range(count):
            size = base + (1 if s < extra else 0)
            bounds.append((start, start + size))
            start += size
        return cls(axis=axis, bounds=tuple(bounds), rank=rank)

    @property
    def strip(self) -> int:
        """The index of the strip this rank decodes."""
        return self.rank % len(self.bounds)

    @property
    def rows(self) -> int:
        """Latent rows in this rank's strip."""
        start, stop = self.bounds[self.strip]
        return stop - start

    @property
    def max_rows(self) -> int:
        """Latent rows in the tallest strip: what every rank pads to, so all send one shape."""
        return max(stop - start for start, stop in self.bounds)

    def strip_of(self, z: Tensor) -> Tensor:
        """This rank's strip of latent ``z`` (its rows along the axis), contiguous."""
        start, stop = self.bounds[self.strip]
        return z.narrow(self.axis, start, stop - start).contiguous()

    def strip_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) of this rank's strip of a ``height`` × ``width`` latent."""
        return (self.rows, width) if self.axis == -2 else (height, self.rows)

    def scale_of(self, activation: Tensor) -> int:
        """How many activation rows this layer has per latent row (the decoder upsamples by whole factors)."""
        scale, remainder = divmod(activation.shape[self.axis], self.rows)
        if remainder:
            raise RuntimeError(
                f"a decoder layer has {activation.shape[self.axis]} rows for a {self.rows}-row latent strip: "
                "not a whole upsampling factor"
            )
        return scale

    def pad(self, strip: Tensor, scale: int) -> Tensor:
        """``strip`` padded with zeros to the tallest strip, so every rank sends the same shape."""
        missing = (self.max_rows - self.rows) * scale
        if missing == 0:
            return strip.contiguous()
        shape = list(strip.shape)
        shape[self.axis] = missing
        return torch.cat([strip, strip.new_zeros(shape)], dim=self.axis)

    def join(self, pieces: list[Tensor], scale: int) -> Tensor:
        """The whole frame from every rank's padded strip (rank s holds strip s; copies are ignored)."""
        parts = [
            pieces[s].narrow(self.axis, 0, (stop - start) * scale)
            for s, (start, stop) in enumerate(self.bounds)
        ]
        return torch.cat(parts, dim=self.axis)

    def neighbours(self) -> tuple[int | None, int | None]:
        """The ranks holding the strips before and after this rank's (None at the frame's edges)."""
        s = self.strip
        return (s - 1 if s > 0 else None), (s + 1 if s + 1 < len(self.bounds) else None)
