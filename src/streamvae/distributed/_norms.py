"""GroupNorm across strips: a strip normalized with the whole frame's statistics.

A GroupNorm (HunyuanVideo's and CogVideoX's resnets, CogVideoX's spatial norm) normalizes each (batch entry,
channel group) over every frame and every position of its input. Run on a strip alone it would use the
strip's mean and variance, and strips would not join into the frame. Here each rank sums its strip in
float64, one all_gather brings every strip's sums, and every rank adds them in strip order, so all ranks
normalize with the same whole-frame statistics.

What this cannot give is torch's own rounding: torch sums the whole frame in its own blocking and order,
which a sum of strips does not reproduce. The float64 sums are at least as accurate, so a strip differs from
the single-process decode by float rounding (docs/distributed.md measures it per family). A hook cannot
replace a layer's computation, so each GroupNorm's forward is wrapped instead (:func:`wrap_group_norm`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from streamvae.distributed._context import ShardContext, context_for
from streamvae.distributed._internals import replace_forward


def wrap_group_norm(layer: nn.GroupNorm, decoder: nn.Module) -> None:
    """Make ``layer`` normalize a strip with the whole frame's statistics inside a sharded decode of
    ``decoder``; anywhere else it is the layer's own forward."""
    own_forward = layer.forward

    def forward(x: Tensor) -> Tensor:
        context = context_for(decoder)
        if context is None:
            return own_forward(x)
        return group_norm_across_strips(layer, x, context)

    replace_forward(layer, forward)


def group_norm_across_strips(layer: nn.GroupNorm, x: Tensor, context: ShardContext) -> Tensor:
    """``layer(x)`` for a strip ``x`` [B, C, ...] of the whole frame, as if run on the whole frame.

    One all_gather of 2·B·G + 1 float64 values (B·G sums and sums of squares, and the element count) over
    the decode group, counted in ``context.comm.stats.norm_reductions``. Only the ``len(layout.bounds)``
    strips that exist are added: with fewer rows than ranks, the ranks beyond them decode copies, which
    must not count twice. Then y = x·a + b per channel, with a = rstd·γ and b = β − mean·a, as torch's
    kernel computes it, in ``x``'s dtype.
    """
    batch, channels = x.shape[0], x.shape[1]
    groups = layer.num_groups
    grouped = x.reshape(batch, groups, -1).to(torch.float64)
    sums = grouped.sum(dim=-1)
    squares = torch.einsum("bgn,bgn->bg", grouped, grouped)  # no squared copy of the activation
    del grouped
    count = sums.new_full((1,), float(x.numel() // (batch * groups)))
    pieces = context.comm.all_gather(torch.cat([sums.reshape(-1), squares.reshape(-1), count]))
    context.comm.stats.norm_reductions += 1
    total = pieces[0].to(x.device)
    for strip in range(1, len(context.layout.bounds)):  # strip s is on rank s; later ranks hold copies
        total = total + pieces[strip].to(x.device)

    cells = batch * groups
    elements = total[-1]
    mean = total[:cells] / elements
    variance = (total[cells : 2 * cells] / elements - mean * mean).clamp_min(0.0)
    rstd = torch.rsqrt(variance + layer.eps)
    per_group = channels // groups
    scale = rstd.view(batch, groups).repeat_interleave(per_group, dim=1)  # [B, C]
    shift = -mean.view(batch, groups).repeat_interleave(per_group, dim=1) * scale
    if layer.weight is not None:
        weight = layer.weight.to(torch.float64)
        scale = scale * weight
        shift = shift * weight
    if layer.bias is not None:
        shift = shift + layer.bias.to(torch.float64)
    broadcast = (batch, channels) + (1,) * (x.ndim - 2)
    return x * scale.to(x.dtype).view(broadcast) + shift.to(x.dtype).view(broadcast)
