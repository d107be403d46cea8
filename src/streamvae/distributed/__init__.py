"""Spatial-shard decode over ``torch.distributed``: every rank decodes a strip of every frame.

When one accelerator cannot decode a long high-resolution video fast enough (or at all), the ranks of a
process group split each latent frame's height (or width) into strips; each rank runs the Wan decoder on its
strip, with the neighbours' boundary rows ("halos") passed to every convolution that mixes space and the
whole frame gathered for the per-frame mid-block attention, so the strips join into the single-rank decode
(the same operations on the same values). The rank that owns the output gathers each chunk and publishes
it; the others publish nothing.

The guarantee (see docs/distributed.md): every rank runs the same collectives in the same order, whatever
its strip, and none skips one because the owner's consumer failed or its caller was cancelled. After each
latent frame the owner tells every rank whether publishing failed; if it did, all ranks stop at that same
boundary, the owner raises the original error and every other rank raises :class:`PeerDecodeError`.
That agreement runs over gloo with host tensors (over the decode group itself when it is gloo, else over a
gloo group on the same ranks), so it never waits for a GPU stream, where an NCCL collective with a dead
peer may never finish; each of its waits is bounded by the collective timeout, in a worker thread that
:func:`streamvae.decode_to_mp4` never abandons.

The parts: ``_layout`` (which rows each rank decodes), ``_collectives`` (the decode group's gathers and
the agreement), ``_halo`` (the hooks on the decoder's layers), ``_decoder`` (the step loop and its
failure rule), ``_launch`` (joining torchrun's group, the collective timeout), ``_stats``.
"""

from streamvae.distributed._decoder import PeerDecodeError, ShardedWanDecoder
from streamvae.distributed._launch import init_distributed
from streamvae.distributed._layout import ShardAxis
from streamvae.distributed._stats import ShardedDecodeStats

__all__ = [
    "PeerDecodeError",
    "ShardAxis",
    "ShardedDecodeStats",
    "ShardedWanDecoder",
    "init_distributed",
]
