"""Kernel routing: a strip's CPU convolution runs the kernel PyTorch picks for the whole frame.

PyTorch picks a CPU convolution's kernel by input size: oneDNN for a 3D input with more than 20,480
``N·C·T·H`` (2D: ``N·C·H·W``), else vol2col + GEMM, which sums in another order, runs 2-4× slower with one
thread and holds a 27× column buffer. A height strip (and, for the 2D convs, either strip) can fall below
that threshold where the whole frame is above it, so the strip would round differently from the
single-process decode and take more memory than it (docs/distributed.md measures it). oneDNN gives each
output row the same bits whatever the rows around it, so the strip run on the whole frame's kernel stays
``torch.equal`` to the single-process decode.

Installed with the other hooks (``_hooks``), on the convolutions it can matter for: ungrouped ones with
numeric padding, where this torch lets the kernel be chosen (``_internals``; elsewhere the strip runs its
own kernel, correct but not bit-identical where the kernels differ). Only CPU inputs are routed: on
another device no strip convolution asks for the kernel choice.
"""

from __future__ import annotations

import weakref
from typing import TypeGuard

from torch import Tensor, nn

from streamvae.distributed._context import ShardContext, context_for
from streamvae.distributed._internals import (
    Conv,
    ConvForward,
    can_select_conv_kernel,
    conv_kernel,
    run_conv_kernel,
    wrap_conv_forward,
)

_routed: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def route_kernel(decoder: nn.Module, conv: nn.Module) -> None:
    """Make ``conv`` run the whole frame's kernel on a strip inside a sharded decode of ``decoder`` (once).

    Called by ``install_hooks`` (under its lock) for each spatial convolution; one the routing cannot
    matter for (grouped, padded by name) is left as it is, and so is every one where this torch does not
    let the kernel be chosen.
    """
    if not _routable(conv) or conv in _routed:
        return

    def routed(plain: ConvForward, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        context = context_for(decoder)
        extra = context.extra_rows.pop(id(conv), None) if context is not None else None
        if context is None or not extra:
            return plain(x, weight, bias)
        shape = list(x.shape)
        shape[context.layout.axis] += extra
        whole = x.new_zeros(()).expand(shape)  # the whole frame's shape, no memory
        chosen = conv_kernel(conv, whole, weight, bias)
        if chosen == conv_kernel(conv, x, weight, bias):
            return plain(x, weight, bias)
        out = run_conv_kernel(chosen, conv, x, weight, bias)
        if out is None:  # a kernel this torch does not let us call: the strip's own
            return plain(x, weight, bias)
        context.comm.stats.kernel_overrides += 1
        return out

    wrap_conv_forward(conv, routed)
    _routed.add(conv)


def _routable(conv: nn.Module) -> TypeGuard[Conv]:
    return (
        isinstance(conv, (nn.Conv2d, nn.Conv3d))
        and conv.groups == 1
        and not isinstance(conv.padding, str)
        and can_select_conv_kernel()
    )


def expect_whole_frame(context: ShardContext, conv: nn.Module, strip: Tensor, extended: Tensor) -> None:
    """For a pre-hook: ``conv``'s next call, on ``extended`` (``strip`` and its halo rows), takes the
    whole frame's kernel.

    ``conv`` is the ``nn.Conv2d``/``nn.Conv3d`` that will convolve ``extended`` (padded or not by the
    layer's own forward). Nothing is recorded for a convolution that is not routed or an input off the
    CPU, so those calls never ask for the kernel choice.
    """
    if conv not in _routed or extended.device.type != "cpu":
        return
    layout = context.layout
    whole = layout.scale_of(strip) * layout.bounds[-1][1]  # the whole frame's rows of this input
    context.extra_rows[id(conv)] = whole - extended.shape[layout.axis]
