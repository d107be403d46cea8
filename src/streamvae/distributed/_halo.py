"""The hooks that make a strip's decode the whole frame's: halos for convolutions, whole frames for attention.

Registered once on the shared decoder's layers, they act only while :func:`active` has made a
:class:`ShardContext` this thread's sharded decode of that decoder; anywhere else (another thread, another
decoder) they return at once, so a plain decode of the same module is unaffected. Before a convolution
that mixes space, each side that has a neighbouring strip gets that neighbour's boundary rows, and the
rows they add to the output are cropped after it; at the frame's edges nothing is added, so the layer's
own padding (zeros, or HunyuanVideo's replicate, LTX-2's reflect) applies as in the single-rank decode. A
convolution that pads its input itself before an inner unpadded one (HunyuanVideo's causal conv) gets the
halo at the wrapper, before its padding. Attention blocks (and HunyuanVideo's mid-block, which attends
inside its own forward) run on the whole frame, gathered from every strip, with their inner layers unhooked,
and keep this rank's rows. GroupNorm normalizes with the whole frame's statistics (``_norms``). What none of
this can make exact is refused by :func:`check_shardable`, naming the layer.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import Attention
from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import (
    HunyuanVideoCausalConv3d,
    HunyuanVideoMidBlock3D,
)
from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoResnetBlock3d
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageAttentionBlock
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock
from diffusers.models.embeddings import TimestepEmbedding
from diffusers.models.normalization import RMSNorm
from torch import Tensor, nn

from streamvae.distributed._layout import StripLayout
from streamvae.distributed._norms import group_norm_across_strips
from streamvae.distributed._stats import ShardedDecodeStats

_ATTENTION_BLOCKS = (WanAttentionBlock, QwenImageAttentionBlock)  # 5-D in, 5-D out: gathered as they are
# attention anywhere else is refused (AttentionModuleMixin: the newer families' own, MiniMax-H3's ViT's)
_ATTENTION = (Attention, AttentionModuleMixin, nn.MultiheadAttention)
_NOISE_RESNETS: tuple[type[nn.Module], ...] = (LTXVideoResnetBlock3d,)  # may draw noise per call
# Per-position norms that reduce over channels with a strided sum, and the dim they reduce (see
# _positions_align_pre_hook); Wan's RMS norm (F.normalize) has no such tail and is not among them.
_CHANNEL_NORMS: dict[type[nn.Module], Callable[[nn.Module], int]] = {
    RMSNorm: lambda layer: -1,  # LTX calls it on channels-last views
}
try:
    from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoResnetBlock3d, PerChannelRMSNorm
except ImportError:  # diffusers before LTX-2: nothing of it to recognise
    pass
else:
    _NOISE_RESNETS += (LTX2VideoResnetBlock3d,)
    _CHANNEL_NORMS[PerChannelRMSNorm] = lambda layer: cast(int, layer.channel_dim)
_SPATIAL_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LocalResponseNorm)
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
    extra_rows: dict[int, int] = field(default_factory=dict)  # id(conv) -> rows the whole frame has beyond

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

    ``layer`` is an ``nn.Conv2d``/``nn.Conv3d`` with 'same' padding of its own, or a convolution that pads
    its input itself before an inner one without padding (HunyuanVideo's causal conv; CogVideoX's in
    replicate mode). Raises ValueError for a convolution whose rows do not map one to one (stride,
    dilation, padding other than kernel // 2 on each side), which a halo cannot make exact.
    """
    inner = _self_padded_inner(layer)
    if inner is not None:
        # F.pad order (W, W, H, H, T, T): the wrapper's own padding, the inner conv pads nothing.
        pads: tuple[int, ...] = tuple(cast(tuple[int, ...], layer.time_causal_padding))
        before, after = pads[0:2] if axis == -1 else pads[2:4]
        if inner.padding[axis] != 0 or before != after:
            raise ValueError(
                f"cannot shard {type(layer).__name__}(padding={pads}, inner padding={inner.padding}): "
                "only a symmetric padding of the wrapper's input, and none in its inner convolution"
            )
        return _same_halo(type(layer).__name__, inner, axis, before)
    assert isinstance(layer, (nn.Conv2d, nn.Conv3d))
    if isinstance(layer, nn.Conv3d):
        # Wan's causal conv zeroes ``padding`` and pads in forward from ``_padding`` (W, W, H, H, T, 0).
        causal = getattr(layer, "_padding", None)
        padding = causal[0 if axis == -1 else 2] if causal is not None else layer.padding[axis]
    else:
        padding = layer.padding[axis]
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


def check_shardable(decoder: nn.Module, axis: int) -> None:
    """Raise ValueError, naming the layer, unless every layer of ``decoder`` can be sharded along ``axis``.

    Refused: convolutions whose rows do not map one to one (:func:`halo_rows`), upsampling other than
    nearest by a whole factor, attention outside the blocks that get the whole frame gathered, noise drawn
    per call in the strip's shape (LTX's ``decoder_inject_noise``: a strip's noise is not the frame's
    rows), and normalizations over space other than GroupNorm. Layers inside a whole-frame block run on
    whole frames and are not checked.
    """
    inside = _inside_whole_frame_blocks(decoder)
    inner = _inner_convs(decoder)
    for name, layer in decoder.named_modules():
        if layer in inside or layer in inner:
            continue
        try:
            _check_layer(layer, axis)
        except ValueError as error:
            raise ValueError(f"decoder layer {name or '(the decoder)'!r}: {error}") from None


def _check_layer(layer: nn.Module, axis: int) -> None:
    if _self_padded_inner(layer) is not None or isinstance(layer, (nn.Conv2d, nn.Conv3d)):
        halo_rows(layer, axis)
    elif isinstance(layer, nn.Upsample):
        scale = layer.scale_factor
        factors = scale if isinstance(scale, tuple) else (scale,)
        if layer.mode not in ("nearest", "nearest-exact") or any(
            f is None or float(f) != int(f) for f in factors
        ):
            # Nearest upsampling by a whole factor maps each input row to its own output rows.
            raise ValueError(f"cannot shard {layer!r}: only whole nearest upsampling is")
    elif isinstance(layer, _ATTENTION):
        blocks = ", ".join(c.__name__ for c in (*_ATTENTION_BLOCKS, HunyuanVideoMidBlock3D))
        raise ValueError(
            f"cannot shard {type(layer).__name__}: attention mixes the whole frame, which is gathered only "
            f"for the attention of {blocks}"
        )
    elif isinstance(layer, _NOISE_RESNETS) and getattr(layer, "per_channel_scale1", None) is not None:
        raise ValueError(
            f"cannot shard {type(layer).__name__} with injected noise (decoder_inject_noise): it draws "
            "noise in the strip's shape on every call, which is not the whole frame's noise"
        )
    elif isinstance(layer, _SPATIAL_NORMS):
        raise ValueError(f"cannot shard {type(layer).__name__}: it normalizes over space")
    elif isinstance(layer, nn.LayerNorm) and len(layer.normalized_shape) > 1:
        raise ValueError(f"cannot shard {layer!r}: only a LayerNorm over channels is per position")


def _self_padded_inner(layer: nn.Module) -> nn.Conv3d | None:
    """The inner convolution of a wrapper that pads its input itself (F.pad), else None."""
    if isinstance(layer, HunyuanVideoCausalConv3d) or (
        isinstance(layer, CogVideoXCausalConv3d) and layer.pad_mode == "replicate"
    ):
        conv = layer.conv
        assert isinstance(conv, nn.Conv3d)
        return conv
    return None


def _inner_convs(decoder: nn.Module) -> set[nn.Module]:
    """The inner convolutions of self-padding wrappers: the wrapper gets the halo, they get nothing."""
    inner = (_self_padded_inner(layer) for layer in decoder.modules())
    return {conv for conv in inner if conv is not None}


def _whole_frame_blocks(decoder: nn.Module) -> list[nn.Module]:
    """The blocks that mix the whole frame and get it gathered: attention, HunyuanVideo's attending mid-block.

    HunyuanVideo attends inside its mid-block's own forward (over frames, rows and columns flattened, with
    a causal mask), so the whole mid-block is the unit: it runs on the whole frame, at latent resolution.
    """
    return [
        layer
        for layer in decoder.modules()
        if isinstance(layer, _ATTENTION_BLOCKS)
        or (isinstance(layer, HunyuanVideoMidBlock3D) and any(a is not None for a in layer.attentions))
    ]


def _inside_whole_frame_blocks(decoder: nn.Module) -> set[nn.Module]:
    """Every layer inside a whole-frame block (not the block itself): it sees whole frames only."""
    return {
        layer for block in _whole_frame_blocks(decoder) for layer in block.modules() if layer is not block
    }


_hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_install_lock = threading.Lock()


def install_hooks(decoder: nn.Module) -> None:
    """Register the halo and gather hooks on ``decoder``'s spatial layers, once per module.

    They stay registered and do nothing outside a sharded decode of ``decoder`` in the calling thread.
    Each GroupNorm's forward is wrapped instead (a hook cannot replace a layer's computation): outside a
    sharded decode it is the layer's own. Layers inside a whole-frame block get nothing: the block
    gathers the whole frame at its entry, so they run natively on whole frames, as in the single-process
    decode, and it keeps this rank's rows at its exit.
    """
    with _install_lock:
        if decoder in _hooked:
            return
        whole_frame = _whole_frame_blocks(decoder)
        skipped = (
            _inside_whole_frame_blocks(decoder) | _inner_convs(decoder) | _time_embedding_layers(decoder)
        )
        for layer in decoder.modules():
            if layer in skipped:
                continue
            inner = _self_padded_inner(layer)  # a self-padding wrapper is hooked for its inner conv
            conv = layer if inner is None else inner
            spatial = isinstance(conv, (nn.Conv2d, nn.Conv3d)) and any(k > 1 for k in conv.kernel_size[-2:])
            if spatial:
                layer.register_forward_pre_hook(_conv_pre_hook(decoder), with_kwargs=True)
            elif layer in whole_frame:
                layer.register_forward_pre_hook(_attention_pre_hook(decoder))
            if spatial or layer in whole_frame:
                layer.register_forward_hook(_crop_hook(decoder))
            if isinstance(layer, _VECTOR_ROUNDED):
                layer.register_forward_pre_hook(_align_pre_hook(decoder))
                layer.register_forward_hook(_unalign_hook(decoder))
            if type(layer) in _CHANNEL_NORMS:
                layer.register_forward_pre_hook(_positions_align_pre_hook(decoder))
                layer.register_forward_hook(_positions_unalign_hook(decoder))
            if isinstance(layer, nn.GroupNorm):
                _wrap_group_norm(layer, decoder)
        _hooked.add(decoder)


def _time_embedding_layers(decoder: nn.Module) -> set[nn.Module]:
    """Layers of the decode timestep's embedding (LTX): not a strip, the same on every rank, left alone."""
    return {
        layer
        for embedding in decoder.modules()
        if isinstance(embedding, TimestepEmbedding)
        for layer in embedding.modules()
    }


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
        strip = x
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
        # A self-padding wrapper pads what it is given: the halo rows go in before its F.pad (which pads
        # them too, rows the crop drops) and its inner conv, which convolves that, gets the kernel.
        inner = _self_padded_inner(layer)
        whole_frame_kernel(decoder, context, layer if inner is None else inner, strip, x)
        return args, kwargs

    return hook


# The CPU kernels ``F.conv2d``/``F.conv3d`` call, by the name of the backend PyTorch selects for the input.
_KERNELS: dict[str, Callable[[Any, Tensor, Tensor, Tensor | None], Tensor]] = {
    "Mkldnn": lambda layer, x, w, b: torch.ops.aten.mkldnn_convolution(
        x, w, b, layer.padding, layer.stride, layer.dilation, 1
    ),
    "Slow3d": lambda layer, x, w, b: torch.ops.aten.slow_conv3d(
        x, w, layer.kernel_size, b, layer.stride, layer.padding
    ),
    "Slow2d": lambda layer, x, w, b: torch.ops.aten.thnn_conv2d(
        x, w, layer.kernel_size, b, layer.stride, layer.padding
    ),
}


def whole_frame_kernel(
    decoder: nn.Module, context: ShardContext, conv: nn.Module, strip: Tensor, extended: Tensor
) -> None:
    """Make ``conv``'s next call, on ``extended`` (``strip`` and its halo rows), use the whole frame's kernel.

    For a pre-hook: ``conv`` is the ``nn.Conv2d``/``nn.Conv3d`` that will convolve ``extended`` (padded
    or not by the layer's own forward). See :func:`_route_kernel` for why.
    """
    if not isinstance(conv, (nn.Conv2d, nn.Conv3d)):
        return
    _route_kernel(decoder, conv)
    layout = context.layout
    whole = layout.scale_of(strip) * layout.bounds[-1][1]  # the whole frame's rows of this input
    context.extra_rows[id(conv)] = whole - extended.shape[layout.axis]


def _route_kernel(decoder: nn.Module, layer: nn.Conv2d | nn.Conv3d) -> None:
    """Make ``layer`` convolve a strip with the kernel PyTorch picks for the whole frame (once per layer).

    PyTorch picks a CPU convolution's kernel by input size: oneDNN for a 3D input with more than 20,480
    ``N·C·T·H`` (2D: ``N·C·H·W``), else vol2col + GEMM, which sums in another order, runs 2-4× slower with
    one thread and holds a 27× column buffer. A height strip (and, for the 2D convs, either strip) can fall
    below that threshold where the whole frame is above it, so the strip would round differently from the
    single-process decode and take more memory than it. ``_conv_forward`` is where ``nn.Conv2d``/``nn.Conv3d``
    call ``F.conv*`` on the padded input, the one place that sees the shape the kernel choice is made on.
    """
    if "_conv_forward" in vars(layer):
        return
    plain: Callable[..., Tensor] = type(layer)._conv_forward

    def conv_forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        context = _context_for(decoder)
        extra = context.extra_rows.pop(id(layer), None) if context is not None else None
        if context is None or not extra or layer.groups != 1 or isinstance(layer.padding, str):
            return plain(layer, x, weight, bias)
        if _SELECT_CONV_BACKEND is None:  # a torch without the private selector: the strip's own kernel
            return plain(layer, x, weight, bias)
        shape = list(x.shape)
        shape[context.layout.axis] += extra
        whole = x.new_zeros(()).expand(shape)  # the whole frame's shape, no memory
        chosen = _select_backend(layer, whole, weight, bias)
        kernel = _KERNELS.get(chosen)
        if kernel is None or chosen == _select_backend(layer, x, weight, bias):
            return plain(layer, x, weight, bias)
        context.comm.stats.kernel_overrides += 1
        return kernel(layer, x.contiguous(), weight.contiguous(), bias)

    layer._conv_forward = conv_forward  # type: ignore[method-assign,assignment]


#: torch's private choice of convolution kernel (present in torch 2.x); None where a torch lacks it
_SELECT_CONV_BACKEND: Callable[..., Any] | None = getattr(torch._C, "_select_conv_backend", None)


def _select_backend(layer: nn.Conv2d | nn.Conv3d, x: Tensor, weight: Tensor, bias: Tensor | None) -> str:
    """The backend ``F.conv*`` would run for ``x``, by name (``torch._C._select_conv_backend``'s choice)."""
    assert _SELECT_CONV_BACKEND is not None
    zeros = [0] * len(layer.stride)
    backend = _SELECT_CONV_BACKEND(
        x, weight, bias, layer.stride, layer.padding, layer.dilation, False, zeros, layer.groups, None
    )
    return str(backend.name)


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


def _crop_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...], Any], Any]:
    def hook(layer: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        context = _context_for(decoder)
        if context is None:
            return None
        top, bottom = context.crops.pop(id(layer))
        axis = context.layout.axis
        # CogVideoX's self-padding causal conv returns (output, conv_cache); in replicate mode its cache is
        # None. Every other hooked layer returns the activation alone.
        first: Tensor = output[0] if isinstance(output, tuple) else output
        cropped = first.narrow(axis, top, first.shape[axis] - top - bottom)
        return (cropped, *output[1:]) if isinstance(output, tuple) else cropped

    return hook


# ----------------------------------------------------------------------- layers the Wan family lacks


def _wrap_group_norm(layer: nn.GroupNorm, decoder: nn.Module) -> None:
    """Make ``layer`` normalize a strip with the whole frame's statistics inside a sharded decode."""
    own_forward = layer.forward

    def forward(x: Tensor) -> Tensor:
        context = _context_for(decoder)
        if context is None:
            return own_forward(x)
        return group_norm_across_strips(layer, x, context)

    layer.forward = forward  # type: ignore[method-assign,assignment]


def _positions_align_pre_hook(
    decoder: nn.Module,
) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        context = _context_for(decoder)
        x: Tensor = args[0]
        if context is None or x.device.type != "cpu":
            return None
        # The CPU sum over a strided channel dim runs 32 positions at a time with vector code, the rest with
        # scalar code that adds in another order. A strip's positions are a cropped view (several runs, each
        # with its own tail) where the frame's are one run: lay them out as one run of whole vector steps.
        dim = _CHANNEL_NORMS[type(layer)](layer) % x.ndim
        channels_first = x.movedim(dim, 1)
        context.shapes[id(layer)] = channels_first.shape
        flat = channels_first.reshape(x.shape[0], x.shape[dim], -1)
        padded = torch.cat(
            [flat, flat.new_zeros((*flat.shape[:2], -flat.shape[2] % _CPU_VECTOR_STEP))], dim=2
        )
        return (padded.movedim(1, dim if dim < 2 else -1), *args[1:])

    return hook


def _positions_unalign_hook(
    decoder: nn.Module,
) -> Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor | None]:
    def hook(layer: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        context = _context_for(decoder)
        shape = context.shapes.pop(id(layer), None) if context is not None else None
        if shape is None:
            return None
        dim = _CHANNEL_NORMS[type(layer)](layer) % len(shape)
        flat = output.movedim(dim if dim < 2 else -1, 1)
        return flat[:, :, : shape[2:].numel()].reshape(shape).movedim(1, dim)

    return hook
