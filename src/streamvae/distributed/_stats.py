"""What one rank did in its latest sharded decode: the counters the collectives and hooks bump."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ShardedDecodeStats:
    """What one rank did in its latest decode or stream (reset when one starts)."""

    #: steps of the family's walk this rank decoded (Wan: latent frames; one chunk each)
    steps: int = 0
    #: latent frames decoded (the whole latent's, or every piece's so far)
    latent_frames: int = 0
    #: collective calls this rank made; equal on every rank of a decode
    collectives: int = 0
    #: halo exchanges (one a spatial convolution call)
    halo_exchanges: int = 0
    #: whole-frame gathers for the mid-block attention
    attention_gathers: int = 0
    #: convolution calls run on the kernel the whole frame's input gets, not the one the strip's would
    kernel_overrides: int = 0
    #: GroupNorm statistics reductions (one all_gather of per-strip sums a GroupNorm call)
    norm_reductions: int = 0
    #: chunk index at which the output rank stopped the decode, or None if it ran to the end
    stopped_at: int | None = None
