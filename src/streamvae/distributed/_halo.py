"""The hooks that make a strip's decode the whole frame's: halos for convolutions, whole frames for attention.

Registered once on the shared decoder's layers, they act only while :func:`active` has made a
:class:`ShardContext` this thread's sharded decode of that decoder; anywhere else (another thread, another
decoder) they return at once, so a plain decode of the same module is unaffected. Before a convolution
that mixes space, each side that has a neighbouring strip gets that neighbour's boundary rows, and the
rows they add to the output are cropped after it; at the frame's edges nothing is added, so the layer's
own zero padding applies as in the single-rank decode. Attention runs on the whole frame, gathered from
every strip, and keeps this rank's rows.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageAttentionBlock
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock
from torch import Tensor, nn

from streamvae.distributed._layout import StripLayout
from streamvae.distributed._stats import ShardedDecodeStats

_ATTENTION_BLOCKS = (WanAttentionBlock, QwenImageAttentionBlock)
_VECTOR_ROUNDED = (nn.SiLU,)  # elementwise layers whose CPU vector and scalar code round differently
_CPU_VECTOR_STEP = 64  # a whole number of vector-loop steps for AVX2 (16 floats) and AVX-512 (32)


class Gathers(Protocol):
    """What the hooks need from the decode group: one all_gather, and the counters it bumps."""

    stats: ShardedDecodeStats

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """Every rank's ``tensor`` (one shape on every rank), in rank order."""
        ...


@dataclass
class ShardContext:
    """The sharded decode running in this thread: what the decoder's hooks need."""

    decoder: nn.Module
    layout: StripLayout
    comm: Gathers
    crops: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(layer) -> rows to drop
    shapes: dict[int, torch.Size] = field(default_factory=dict)  # id(activation) -> shape before padding

    def extend(self, activations: list[Tensor], halo: int) -> tuple[list[Tensor], int, int]:
        """Each of ``activations`` with ``halo`` neighbour rows on each side that has a neighbour.

        Returns them and how many rows were added before and after. One all_gather carries the first and
        last ``halo`` rows of all of them — a fixed size whatever this rank's strip — so every rank makes
        the same collective even at the frame's edges, where nothing is added and the layer's own zero
        padding applies.
        """
        axis = self.layout.axis
        edges = [a.narrow(axis, 0, halo) for a in activations]
        edges += [a.narrow(axis, a.shape[axis] - halo, halo) for a in activations]
        sizes = [edge.numel() for edge in edges]
        pieces = self.comm.all_gather(torch.cat([edge.reshape(-1) for edge in edges]))
        self.comm.stats.halo_exchanges += 1

        def rows_of(rank: int, index: int) -> Tensor:
            rows: Tensor = pieces[rank].split(sizes)[index].view(edges[index].shape)
            return rows.to(activations[0].device)

        before, after = self.layout.neighbours()
        count = len(activations)
        extended = []
        for i, activation in enumerate(activations):
            parts = [activation]
            if before is not None:
                parts.insert(0, rows_of(before, count + i))  # the last rows of the strip before
            if after is not None:
                parts.append(rows_of(after, i))  # the first rows of the strip after
            extended.append(torch.cat(parts, dim=axis) if len(parts) > 1 else activation)
        return extended, halo if before is not None else 0, halo if after is not None else 0

    def whole_frame(self, activation: Tensor) -> tuple[Tensor, int, int]:
        """Every rank's strip of ``activation`` joined, and where this rank's rows sit in it."""
        layout = self.layout
        scale = layout.scale_of(activation)
        pieces = self.comm.all_gather(layout.pad(activation, scale))
        self.comm.stats.attention_gathers += 1
        start = layout.bounds[layout.strip][0] * scale
        return layout.join(pieces, scale).to(activation.device), start, layout.rows * scale


_local = threading.local()


@contextmanager
def active(context: ShardContext) -> Iterator[None]:
    """Make ``context`` the sharded decode of this thread while the block runs."""
    _local.context = context
    try:
        yield
    finally:
        _local.context = None
        context.crops.clear()
        context.shapes.clear()


def _context_for(decoder: nn.Module) -> ShardContext | None:
    context: ShardContext | None = getattr(_local, "context", None)
    if context is None or context.decoder is not decoder:
        return None
    return context


def halo_rows(layer: nn.Module, axis: int) -> int:
    """Rows a convolution reads beyond each output row along ``axis`` (0: it mixes nothing there).

    Raises ValueError for a convolution whose rows do not map one to one (stride, dilation, padding other
    than kernel // 2), which a halo cannot make exact.
    """
    assert isinstance(layer, (nn.Conv2d, nn.Conv3d))
    kernel, stride, dilation = layer.kernel_size[axis], layer.stride[axis], layer.dilation[axis]
    if isinstance(layer, nn.Conv3d):
        # Wan's causal conv zeroes ``padding`` and pads in forward from ``_padding`` (W, W, H, H, T, 0).
        causal = getattr(layer, "_padding", None)
        padding = causal[0 if axis == -1 else 2] if causal is not None else layer.padding[axis]
    else:
        padding = layer.padding[axis]
    if kernel == 1 and padding == 0:
        return 0
    if stride != 1 or dilation != 1 or padding != kernel // 2 or kernel % 2 == 0 or kernel // 2 > 1:
        raise ValueError(
            f"cannot shard {type(layer).__name__}(kernel={layer.kernel_size}, stride={layer.stride}, "
            f"padding={padding}): only stride-1 'same' convolutions with kernel 3 are supported"
        )
    return int(kernel // 2)


def check_shardable(decoder: nn.Module, axis: int) -> None:
    """Raise ValueError unless every layer of ``decoder`` that mixes space can be sharded along ``axis``."""
    for layer in decoder.modules():
        if isinstance(layer, (nn.Conv2d, nn.Conv3d)):
            halo_rows(layer, axis)
        elif isinstance(layer, nn.Upsample):
            scale = layer.scale_factor
            factors = scale if isinstance(scale, tuple) else (scale,)
            if layer.mode not in ("nearest", "nearest-exact") or any(
                f is None or float(f) != int(f) for f in factors
            ):
                # Nearest upsampling by a whole factor maps each input row to its own output rows.
                raise ValueError(f"cannot shard a decoder with {layer!r}: only whole nearest upsampling is")


_hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_install_lock = threading.Lock()


def install_hooks(decoder: nn.Module) -> None:
    """Register the halo and gather hooks on ``decoder``'s spatial layers, once per module.

    They stay registered and do nothing outside a sharded decode of ``decoder`` in the calling thread.
    """
    with _install_lock:
        if decoder in _hooked:
            return
        for layer in decoder.modules():
            spatial = isinstance(layer, (nn.Conv2d, nn.Conv3d)) and any(k > 1 for k in layer.kernel_size[-2:])
            if spatial:
                layer.register_forward_pre_hook(_conv_pre_hook(decoder), with_kwargs=True)
            elif isinstance(layer, _ATTENTION_BLOCKS):
                layer.register_forward_pre_hook(_attention_pre_hook(decoder))
            if spatial or isinstance(layer, _ATTENTION_BLOCKS):
                layer.register_forward_hook(_crop_hook(decoder))
            if isinstance(layer, _VECTOR_ROUNDED):
                layer.register_forward_pre_hook(_align_pre_hook(decoder))
                layer.register_forward_hook(_unalign_hook(decoder))
        _hooked.add(decoder)


_PreHook = Callable[
    [nn.Module, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]] | None
]


def _conv_pre_hook(decoder: nn.Module) -> _PreHook:
    def hook(
        layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        context = _context_for(decoder)
        if context is None:
            return None
        halo = halo_rows(layer, context.layout.axis)
        x: Tensor = args[0]
        cache = args[1] if len(args) > 1 else kwargs.get("cache_x")
        causal = getattr(layer, "_padding", None)
        if halo == 0:
            top = bottom = 0
        elif isinstance(cache, Tensor) and causal is not None and causal[4] > 0:
            # The causal conv prepends the cache along time before padding: both need the same halo rows.
            (x, cache), top, bottom = context.extend([x, cache.to(x.device)], halo)
            args = (x, cache, *args[2:])
            kwargs = {k: v for k, v in kwargs.items() if k != "cache_x"}
        else:
            (x,), top, bottom = context.extend([x], halo)
            args = (x, *args[1:])
        context.crops[id(layer)] = (top, bottom)
        return args, kwargs

    return hook


def _attention_pre_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = _context_for(decoder)
        if context is None:
            return None
        # Attention mixes the whole frame: run it on the whole frame, then keep this rank's rows.
        frame, start, rows = context.whole_frame(args[0])
        total = frame.shape[context.layout.axis]
        context.crops[id(layer)] = (start, total - start - rows)
        return (frame, *args[1:])

    return hook


def _align_pre_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = _context_for(decoder)
        x = args[0]
        if context is None or x.device.type != "cpu" or x.numel() % _CPU_VECTOR_STEP == 0:
            return None
        # CPU kernels compute a tensor's last numel % step elements with scalar code, whose exp rounds
        # differently from the vector code; a strip's tail is not the whole frame's, so run it all vectorized.
        context.shapes[id(layer)] = x.shape
        flat = x.reshape(-1)
        return (torch.cat([flat, flat.new_zeros(-flat.numel() % _CPU_VECTOR_STEP)]), *args[1:])

    return hook


def _unalign_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        context = _context_for(decoder)
        shape = context.shapes.pop(id(layer), None) if context is not None else None
        if shape is None:
            return None
        return output[: shape.numel()].view(shape)

    return hook


def _crop_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        context = _context_for(decoder)
        if context is None:
            return None
        top, bottom = context.crops.pop(id(layer))
        axis = context.layout.axis
        return output.narrow(axis, top, output.shape[axis] - top - bottom)

    return hook
