"""Every private API of torch and every diffusers layer internal that the sharded decode touches.

Nothing else in this package names a private attribute of torch or diffusers. Each touchpoint below says
why it is needed and what happens without it, and the installed versions are checked once, when this
module is imported, not on every call:

- torch's choice of convolution kernel (``torch._C._select_conv_backend``) and the CPU kernels it names,
  called through ``torch.ops.aten``; probed once on a tiny input. Without them (a torch that lacks the
  selector, or whose selector or kernels changed) a strip's convolution runs the kernel PyTorch picks for
  the strip: still correct, only not bit-identical to the single-process decode where the two kernels
  differ (``_kernels``).
- ``nn.Conv2d._conv_forward`` / ``nn.Conv3d._conv_forward``, replaced on the convolutions that route
  their kernel, and ``forward``, replaced on GroupNorms: a hook can change a layer's input and output,
  not its computation.
- a process group's own timeout (``ProcessGroup._device_types``, ``_get_backend(...).options._timeout``):
  without it a decoder falls back to what ``init_distributed`` was told, then to torch's defaults.
- diffusers layers' internal attributes: Wan's and Qwen-Image's ``_padding``, HunyuanVideo's and
  CogVideoX's ``time_causal_padding``, LTX's ``per_channel_scale1``, LTX-2's ``channel_dim``. The
  installed diffusers is checked once for each (its ``__init__`` must still set it); a layer whose class
  no longer does is refused by :func:`check_internals` before any collective, since reading a default in
  its place would make the strips silently wrong.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import diffusers
import torch
import torch.distributed as dist
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoCausalConv3d
from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoResnetBlock3d
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageCausalConv3d
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
from diffusers.models.normalization import RMSNorm
from torch import Tensor, nn

# ------------------------------------------------------------------------------- torch: convolution kernels

Conv = nn.Conv2d | nn.Conv3d
ConvForward = Callable[[Tensor, Tensor, Tensor | None], Tensor]


def _probe_selector() -> Callable[..., Any] | None:
    """torch's private kernel selector, if it is there and answers as torch 2.x's does; else None."""
    select: Callable[..., Any] | None = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        return None
    x = torch.zeros(1, 1, 3, 3)
    try:
        name = select(x, x, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, None).name
    except (TypeError, RuntimeError, AttributeError):  # its signature or its answer changed
        return None
    return select if isinstance(name, str) else None


_SELECT_CONV_BACKEND = _probe_selector()

# The CPU kernels ``F.conv2d``/``F.conv3d`` call, by the name of the backend the selector picks for an
# input, called with the arguments ``F.conv*`` passes them; one missing from this torch is not routed to.
_KERNELS: dict[str, Callable[[Conv, Tensor, Tensor, Tensor | None], Tensor]] = {}
if hasattr(torch.ops.aten, "mkldnn_convolution"):
    _KERNELS["Mkldnn"] = lambda conv, x, w, b: torch.ops.aten.mkldnn_convolution(
        x, w, b, conv.padding, conv.stride, conv.dilation, 1
    )
if hasattr(torch.ops.aten, "slow_conv3d"):
    _KERNELS["Slow3d"] = lambda conv, x, w, b: torch.ops.aten.slow_conv3d(
        x, w, conv.kernel_size, b, conv.stride, conv.padding
    )
if hasattr(torch.ops.aten, "thnn_conv2d"):
    _KERNELS["Slow2d"] = lambda conv, x, w, b: torch.ops.aten.thnn_conv2d(
        x, w, conv.kernel_size, b, conv.stride, conv.padding
    )


def can_select_conv_kernel() -> bool:
    """Whether this torch lets a convolution's kernel be chosen for another input than its own."""
    return _SELECT_CONV_BACKEND is not None and bool(_KERNELS)


def conv_kernel(conv: Conv, x: Tensor, weight: Tensor, bias: Tensor | None) -> str:
    """The backend ``F.conv*`` would run ``conv`` on ``x`` with, by name (``can_select_conv_kernel()``)."""
    assert _SELECT_CONV_BACKEND is not None
    zeros = [0] * len(conv.stride)
    backend = _SELECT_CONV_BACKEND(
        x, weight, bias, conv.stride, conv.padding, conv.dilation, False, zeros, conv.groups, None
    )
    return str(backend.name)


def run_conv_kernel(name: str, conv: Conv, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """``conv`` of ``x`` on the CPU kernel of backend ``name``, as ``F.conv*`` runs it; None if not one."""
    kernel = _KERNELS.get(name)
    return None if kernel is None else kernel(conv, x.contiguous(), weight.contiguous(), bias)


def wrap_conv_forward(
    conv: Conv, wrapper: Callable[[ConvForward, Tensor, Tensor, Tensor | None], Tensor]
) -> None:
    """Make ``conv`` call ``wrapper(plain, x, weight, bias)`` where it calls ``F.conv*`` (``plain``).

    ``_conv_forward`` is where ``nn.Conv2d``/``nn.Conv3d`` call ``F.conv*`` on the padded input: the one
    place that sees the shape the kernel choice is made on. Replaced on this instance only.
    """
    own: Callable[..., Tensor] = type(conv)._conv_forward
    plain: ConvForward = functools.partial(own, conv)

    def conv_forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return wrapper(plain, x, weight, bias)

    conv._conv_forward = conv_forward  # type: ignore[method-assign,assignment]


def replace_forward(layer: nn.Module, forward: Callable[[Tensor], Tensor]) -> None:
    """Make ``forward`` what calling ``layer`` runs (this instance only): a hook cannot replace it."""
    layer.forward = forward  # type: ignore[method-assign]


# ------------------------------------------------------------------------------ torch: a group's timeout


def group_timeout(group: dist.ProcessGroup | None) -> timedelta | None:
    """The timeout ``group`` was created with, as its backend reports it (None where torch does not say)."""
    whole = dist.group.WORLD if group is None else group
    if whole is None:
        return None
    try:
        for device in whole._device_types:
            timeout: timedelta = whole._get_backend(device).options._timeout
            return timeout
    except (AttributeError, RuntimeError):  # absent or changed in this torch
        return None
    return None


# -------------------------------------------------------------------------- diffusers: layer internals

_CAUSAL_PADDED = (WanCausalConv3d, QwenImageCausalConv3d)
_NOISE_RESNETS: tuple[type[nn.Module], ...] = (LTXVideoResnetBlock3d,)  # may draw noise per call
_PER_CHANNEL_NORMS: tuple[type[nn.Module], ...] = ()
try:
    from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoResnetBlock3d, PerChannelRMSNorm
except ImportError:  # diffusers before LTX-2: nothing of it to recognise
    pass
else:
    _NOISE_RESNETS += (LTX2VideoResnetBlock3d,)
    _PER_CHANNEL_NORMS = (PerChannelRMSNorm,)

# The attribute each class's ``__init__`` must still set, and what it is read for.
_READ: dict[type[nn.Module], tuple[str, str]] = {
    **{cls: ("_padding", "the padding it applies in forward") for cls in _CAUSAL_PADDED},
    HunyuanVideoCausalConv3d: ("time_causal_padding", "the padding it applies before its inner conv"),
    CogVideoXCausalConv3d: ("time_causal_padding", "the padding it applies before its inner conv"),
    **{cls: ("per_channel_scale1", "whether it injects noise") for cls in _NOISE_RESNETS},
    **{cls: ("channel_dim", "the dim it normalizes") for cls in _PER_CHANNEL_NORMS},
}
_CHANGED = {cls: read for cls, read in _READ.items() if read[0] not in cls.__init__.__code__.co_names}


def check_internals(layer: nn.Module) -> None:
    """Raise ValueError if ``layer``'s class no longer sets, in the installed diffusers, what is read here."""
    for cls, (attribute, purpose) in _CHANGED.items():
        if isinstance(layer, cls):
            raise ValueError(
                f"cannot shard {type(layer).__name__}: diffusers {diffusers.__version__} no longer sets its "
                f"{attribute}, which streamvae reads for {purpose}"
            )


def causal_padding(conv: nn.Module) -> tuple[int, ...] | None:
    """The F.pad padding (W, W, H, H, T, 0) a Wan or Qwen-Image causal conv applies in its forward.

    It zeroes its own ``padding`` and pads from ``_padding``, its cache frames first. None for any other
    layer.
    """
    if not isinstance(conv, _CAUSAL_PADDED):
        return None
    padding: tuple[int, ...] = tuple(cast(tuple[int, ...], conv._padding))
    return padding


@dataclass(frozen=True)
class SelfPadded:
    """A convolution that pads its input itself (F.pad) before an inner convolution without padding."""

    padding: tuple[int, ...]  # F.pad order: (W, W, H, H, T, T)
    inner: nn.Conv3d


def self_padded(layer: nn.Module) -> SelfPadded | None:
    """HunyuanVideo's causal conv, or CogVideoX's in replicate mode, as a :class:`SelfPadded`; else None."""
    if isinstance(layer, HunyuanVideoCausalConv3d) or (
        isinstance(layer, CogVideoXCausalConv3d) and layer.pad_mode == "replicate"
    ):
        inner = layer.conv
        assert isinstance(inner, nn.Conv3d)
        return SelfPadded(tuple(layer.time_causal_padding), inner)
    return None


def injects_noise(layer: nn.Module) -> bool:
    """Whether ``layer`` is an LTX resnet that draws noise on every call (``decoder_inject_noise``)."""
    return isinstance(layer, _NOISE_RESNETS) and layer.per_channel_scale1 is not None


def channel_norm_dim(layer: nn.Module) -> int | None:
    """The dim a per-position norm sums its channels over (None: ``layer`` is not one of them).

    diffusers' RMSNorm, which LTX calls on channels-last views (the last dim), and LTX-2's
    PerChannelRMSNorm (its ``channel_dim``). Wan's RMS norm (F.normalize) is not among them.
    """
    if type(layer) is RMSNorm:
        return -1
    if type(layer) in _PER_CHANNEL_NORMS:
        return cast(int, layer.channel_dim)
    return None
