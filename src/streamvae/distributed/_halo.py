"""Convolution halos: a strip's convolution is given its neighbours' boundary rows, and cropped after.

A convolution that mixes space reads rows beyond each output row. Before it runs on a strip, each side
that has a neighbouring strip gets that neighbour's boundary rows (one all_gather of a fixed size, so every
rank makes the same collective even at the frame's edges), and the rows they add to the output are cropped
after it (``_hooks``' crop hook). At the frame's edges nothing is added, so the layer's own padding (zeros,
or HunyuanVideo's replicate, LTX-2's reflect) applies as in the single-rank decode. A convolution that pads
its input itself before an inner unpadded one (HunyuanVideo's causal conv) gets the halo at the wrapper,
before its padding. Only stride-1 'same' convolutions map rows one to one; :func:`halo_rows` refuses the
rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from streamvae.distributed._context import ShardContext, context_for
from streamvae.distributed._internals import causal_padding, self_padded
from streamvae.distributed._kernels import expect_whole_frame

PreHook = Callable[
    [nn.Module, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]] | None
]


def halo_rows(layer: nn.Module, axis: int) -> int:
    """Rows a convolution reads beyond each output row along ``axis`` (0: it mixes nothing there).

    ``layer`` is an ``nn.Conv2d``/``nn.Conv3d`` with 'same' padding of its own, or a convolution that pads
    its input itself before an inner one without padding (HunyuanVideo's causal conv; CogVideoX's in
    replicate mode). Raises ValueError for a convolution whose rows do not map one to one (stride,
    dilation, padding other than kernel // 2 on each side), which a halo cannot make exact.
    """
    wrapper = self_padded(layer)
    if wrapper is not None:
        # F.pad order (W, W, H, H, T, T): the wrapper's own padding, the inner conv pads nothing.
        pads, inner = wrapper.padding, wrapper.inner
        before, after = pads[0:2] if axis == -1 else pads[2:4]
        if inner.padding[axis] != 0 or before != after:
            raise ValueError(
                f"cannot shard {type(layer).__name__}(padding={pads}, inner padding={inner.padding}): "
                "only a symmetric padding of the wrapper's input, and none in its inner convolution"
            )
        return _same_halo(type(layer).__name__, inner, axis, before)
    assert isinstance(layer, (nn.Conv2d, nn.Conv3d))
    causal = causal_padding(layer)  # Wan's causal conv pads in forward, its own ``padding`` zeroed
    padding = causal[0 if axis == -1 else 2] if causal is not None else layer.padding[axis]
    return _same_halo(type(layer).__name__, layer, axis, padding)


def _same_halo(name: str, conv: nn.Conv2d | nn.Conv3d, axis: int, padding: object) -> int:
    """The halo of a stride-1 'same' convolution ``conv`` padded by ``padding`` rows; ValueError otherwise."""
    kernel, stride, dilation = conv.kernel_size[axis], conv.stride[axis], conv.dilation[axis]
    if kernel == 1 and padding == 0:
        return 0
    if stride != 1 or dilation != 1 or padding != kernel // 2 or kernel % 2 == 0 or kernel // 2 > 1:
        raise ValueError(
            f"cannot shard {name}(kernel={conv.kernel_size}, stride={conv.stride}, "
            f"padding={padding}): only stride-1 'same' convolutions with kernel 3 are supported"
        )
    return int(kernel // 2)


def convolving(layer: nn.Module) -> nn.Module:
    """The convolution that convolves what ``layer`` is given: a self-padding wrapper's inner one."""
    wrapper = self_padded(layer)
    return layer if wrapper is None else wrapper.inner


def inner_convs(decoder: nn.Module) -> set[nn.Module]:
    """The inner convolutions of self-padding wrappers: the wrapper gets the halo, they get nothing."""
    wrappers = (self_padded(layer) for layer in decoder.modules())
    return {wrapper.inner for wrapper in wrappers if wrapper is not None}


def exchange_halos(
    context: ShardContext, activations: list[Tensor], halo: int
) -> tuple[list[Tensor], int, int]:
    """Each of ``activations`` with ``halo`` neighbour rows on each side that has a neighbour.

    Returns them and how many rows were added before and after. One all_gather carries the first and
    last ``halo`` rows of all of them — a fixed size whatever this rank's strip — so every rank makes
    the same collective even at the frame's edges, where nothing is added and the layer's own zero
    padding applies.
    """
    axis = context.layout.axis
    edges = [a.narrow(axis, 0, halo) for a in activations]
    edges += [a.narrow(axis, a.shape[axis] - halo, halo) for a in activations]
    sizes = [edge.numel() for edge in edges]
    pieces = context.comm.all_gather(torch.cat([edge.reshape(-1) for edge in edges]))
    context.comm.stats.halo_exchanges += 1

    def rows_of(rank: int, index: int) -> Tensor:
        rows: Tensor = pieces[rank].split(sizes)[index].view(edges[index].shape)
        return rows.to(activations[0].device)

    before, after = context.layout.neighbours()
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


def conv_pre_hook(decoder: nn.Module) -> PreHook:
    """The pre-hook that gives a spatial convolution of ``decoder`` its halo rows (the crop hook drops
    what they add to its output)."""

    def hook(
        layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        context = context_for(decoder)
        if context is None:
            return None
        halo = halo_rows(layer, context.layout.axis)
        x: Tensor = args[0]
        strip = x
        cache = args[1] if len(args) > 1 else kwargs.get("cache_x")
        causal = causal_padding(layer)
        if halo == 0:
            top = bottom = 0
        elif isinstance(cache, Tensor) and causal is not None and causal[4] > 0:
            # The causal conv prepends the cache along time before padding: both need the same halo rows.
            (x, cache), top, bottom = exchange_halos(context, [x, cache.to(x.device)], halo)
            args = (x, cache, *args[2:])
            kwargs = {k: v for k, v in kwargs.items() if k != "cache_x"}
        else:
            (x,), top, bottom = exchange_halos(context, [x], halo)
            args = (x, *args[1:])
        context.crops[id(layer)] = (top, bottom)
        # A self-padding wrapper pads what it is given: the halo rows go in before its F.pad (which pads
        # them too, rows the crop drops) and its inner conv, which convolves that, gets the kernel.
        expect_whole_frame(context, convolving(layer), strip, x)
        return args, kwargs

    return hook
