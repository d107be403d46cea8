"""Spatial-shard decode over ``torch.distributed``: every rank decodes a strip of every frame.

When one accelerator cannot decode a long high-resolution video fast enough (or at all), the ranks of a
process group split each latent frame's height (or width) into strips; :func:`sharded_decoder` gives the
adapter for every family streamvae streams (Wan 2.1 / 2.2 and Qwen-Image, HunyuanVideo, LTX-Video and
LTX-2, CogVideoX). Each rank runs the family's decode on its strip, with the neighbours' boundary rows
("halos") passed to every convolution that mixes space, the whole frame gathered for attention and the
whole frame's statistics for GroupNorm, so the strips join into the single-rank decode. The rank that owns
the output gathers each chunk and publishes it; the others publish nothing. Wan-family latents may also
arrive in pieces (:func:`streamvae.open_latent_stream` on every rank).

The guarantee (see docs/distributed.md): every rank runs the same collectives in the same order, whatever
its strip, and none skips one because the owner's consumer failed or its caller was cancelled. After each
step the owner tells every rank whether publishing failed, and before each walk (a latent, a piece, a
stream's end) the ranks agree on what comes next; if either says stop, all ranks stop at that same
boundary, the rank whose failure it was raises its own error and every other rank raises
:class:`PeerDecodeError`. That agreement runs over gloo with host tensors (over the decode group itself
when it is gloo, else over a gloo group on the same ranks), so it never waits for a GPU stream, where an
NCCL collective with a dead peer may never finish; each of its waits is bounded by the collective timeout,
in a worker thread that :func:`streamvae.decode_to_mp4` never abandons.

The parts, one concept each: ``_layout`` (which rows each rank decodes), ``_auto`` (which axis
``shard="auto"`` takes), ``_collectives`` (the decode group's gathers, the agreement and its wire format),
``_context`` (the sharded decode a thread runs, which every hook reads), ``_hooks`` (which layer gets which
hook, and what is refused), ``_halo`` (convolution halos), ``_attention`` (the whole frame for attention),
``_norms`` (GroupNorm over the whole frame), ``_rounding`` (CPU vector alignment), ``_kernels`` (the whole
frame's convolution kernel), ``_internals`` (every private torch and diffusers API touched, checked once),
``_decoder`` (the sharded decoders: the walk, the boundaries and the failure rule), ``_launch``
(joining torchrun's group, the collective timeout), ``_stats``. :class:`PeerDecodeError` is defined with
every streamvae error, in ``streamvae._errors``.
"""

from streamvae._errors import PeerDecodeError
from streamvae.distributed._decoder import ShardedDecoder, ShardedWanDecoder, sharded_decoder
from streamvae.distributed._launch import init_distributed
from streamvae.distributed._layout import ShardAxis
from streamvae.distributed._stats import ShardedDecodeStats

__all__ = [
    "PeerDecodeError",
    "ShardAxis",
    "ShardedDecodeStats",
    "ShardedDecoder",
    "ShardedWanDecoder",
    "init_distributed",
    "sharded_decoder",
]
