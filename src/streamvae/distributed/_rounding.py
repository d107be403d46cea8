"""CPU rounding alignment: elementwise layers and channel norms compute a strip as the whole frame does.

CPU kernels run a tensor in vector steps and its tail (what is left over) with scalar code, which rounds
differently (SiLU's exp) or adds in another order (a strided sum over channels). A strip's tail is not the
whole frame's, so unaligned it would round apart from the single-process decode. Inside a sharded decode
on the CPU, these hooks pad the layer's input to whole vector steps before it and drop the padding after;
the shape they undo is kept in the context (``shapes``, by ``id(layer)``). On other devices they do
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from streamvae.distributed._context import context_for
from streamvae.distributed._internals import channel_norm_dim

#: elementwise layers whose CPU vector and scalar code round differently
VECTOR_ROUNDED = (nn.SiLU,)
_CPU_VECTOR_STEP = 64  # a whole number of vector-loop steps for AVX2 (16 floats) and AVX-512 (32)

PreHook = Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]
Hook = Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor | None]


def align_pre_hook(decoder: nn.Module) -> PreHook:
    """Before an elementwise layer: its whole input, flat, padded to whole vector steps."""

    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = context_for(decoder)
        x = args[0]
        if context is None or x.device.type != "cpu" or x.numel() % _CPU_VECTOR_STEP == 0:
            return None
        # CPU kernels compute a tensor's last numel % step elements with scalar code, whose exp rounds
        # differently from the vector code; a strip's tail is not the whole frame's, so run it all vectorized.
        context.shapes[id(layer)] = x.shape
        flat = x.reshape(-1)
        return (torch.cat([flat, flat.new_zeros(-flat.numel() % _CPU_VECTOR_STEP)]), *args[1:])

    return hook


def unalign_hook(decoder: nn.Module) -> Hook:
    """After an elementwise layer: its output without the padding, in its input's shape."""

    def hook(layer: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        context = context_for(decoder)
        shape = context.shapes.pop(id(layer), None) if context is not None else None
        if shape is None:
            return None
        return output[: shape.numel()].view(shape)

    return hook


def positions_align_pre_hook(decoder: nn.Module) -> PreHook:
    """Before a channel norm (``_internals.channel_norm_dim``): its positions laid out as one padded run."""

    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = context_for(decoder)
        x: Tensor = args[0]
        reduced = channel_norm_dim(layer)
        if context is None or x.device.type != "cpu" or reduced is None:
            return None
        # The CPU sum over a strided channel dim runs 32 positions at a time with vector code, the rest with
        # scalar code that adds in another order. A strip's positions are a cropped view (several runs, each
        # with its own tail) where the frame's are one run: lay them out as one run of whole vector steps.
        dim = reduced % x.ndim
        channels_first = x.movedim(dim, 1)
        context.shapes[id(layer)] = channels_first.shape
        flat = channels_first.reshape(x.shape[0], x.shape[dim], -1)
        padded = torch.cat(
            [flat, flat.new_zeros((*flat.shape[:2], -flat.shape[2] % _CPU_VECTOR_STEP))], dim=2
        )
        return (padded.movedim(1, dim if dim < 2 else -1), *args[1:])

    return hook


def positions_unalign_hook(decoder: nn.Module) -> Hook:
    """After a channel norm: its output without the padding, in its input's layout."""

    def hook(layer: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        context = context_for(decoder)
        shape = context.shapes.pop(id(layer), None) if context is not None else None
        reduced = channel_norm_dim(layer)
        if shape is None or reduced is None:
            return None
        dim = reduced % len(shape)
        flat = output.movedim(dim if dim < 2 else -1, 1)
        return flat[:, :, : shape[2:].numel()].reshape(shape).movedim(1, dim)

    return hook
