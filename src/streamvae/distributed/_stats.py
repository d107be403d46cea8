"""What one rank did in its latest sharded decode: the counters the collectives and hooks bump."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ShardedDecodeStats:
    """What one rank did in its latest decode (reset when a decode starts)."""

    #: latent frames this rank decoded
    steps: int = 0
    #: collective calls this rank made; equal on every rank of a decode
    collectives: int = 0
    #: halo exchanges (one a spatial convolution call)
    halo_exchanges: int = 0
    #: whole-frame gathers for the mid-block attention
    attention_gathers: int = 0
    #: chunk index at which the output rank stopped the decode, or None if it ran to the end
    stopped_at: int | None = None
