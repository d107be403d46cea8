"""Attention gathers: the blocks that mix the whole frame run on the whole frame, gathered from every strip.

Attention relates every position to every other, which no halo can give a strip. So each attention block
(and HunyuanVideo's mid-block, which attends inside its own forward) gets the whole frame at its entry, one
all_gather of every rank's strip padded to the tallest, and keeps this rank's rows at its exit (``_hooks``'
crop hook). The layers inside such a block are left unhooked: they run natively on whole frames, as in the
single-process decode. Attention anywhere else is refused (``_hooks.check_shardable``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import Attention
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoMidBlock3D
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageAttentionBlock
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock
from torch import Tensor, nn

from streamvae.distributed._context import ShardContext, context_for

#: attention blocks that are 5-D in, 5-D out: gathered as they are
ATTENTION_BLOCKS: tuple[type[nn.Module], ...] = (WanAttentionBlock, QwenImageAttentionBlock)
#: attention layers, refused outside a whole-frame block (AttentionModuleMixin: the newer families' own,
#: MiniMax-H3's ViT's)
ATTENTION = (Attention, AttentionModuleMixin, nn.MultiheadAttention)


def whole_frame_blocks(decoder: nn.Module) -> list[nn.Module]:
    """The blocks that mix the whole frame and get it gathered: attention, HunyuanVideo's attending mid-block.

    HunyuanVideo attends inside its mid-block's own forward (over frames, rows and columns flattened, with
    a causal mask), so the whole mid-block is the unit: it runs on the whole frame, at latent resolution.
    """
    return [
        layer
        for layer in decoder.modules()
        if isinstance(layer, ATTENTION_BLOCKS)
        or (isinstance(layer, HunyuanVideoMidBlock3D) and any(a is not None for a in layer.attentions))
    ]


def inside_whole_frame_blocks(decoder: nn.Module) -> set[nn.Module]:
    """Every layer inside a whole-frame block (not the block itself): it sees whole frames only."""
    return {layer for block in whole_frame_blocks(decoder) for layer in block.modules() if layer is not block}


def whole_frame_names() -> str:
    """The blocks whose attention gets the whole frame, by class name (for refusals)."""
    return ", ".join(cls.__name__ for cls in (*ATTENTION_BLOCKS, HunyuanVideoMidBlock3D))


def gather_whole_frame(context: ShardContext, activation: Tensor) -> tuple[Tensor, int, int]:
    """Every rank's strip of ``activation`` joined, and where this rank's rows sit in it (start, count)."""
    layout = context.layout
    scale = layout.scale_of(activation)
    pieces = context.comm.all_gather(layout.pad(activation, scale))
    context.comm.stats.attention_gathers += 1
    start = layout.bounds[layout.strip][0] * scale
    return layout.join(pieces, scale).to(activation.device), start, layout.rows * scale


def attention_pre_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
    """The pre-hook that gives a whole-frame block of ``decoder`` the whole frame (the crop hook keeps
    this rank's rows of its output)."""

    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = context_for(decoder)
        if context is None:
            return None
        frame, start, rows = gather_whole_frame(context, args[0])
        total = frame.shape[context.layout.axis]
        context.crops[id(layer)] = (start, total - start - rows)
        return (frame, *args[1:])

    return hook
