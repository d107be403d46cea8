"""Which of a decoder's layers get which hook, and which layers no hook can make exact.

:func:`install_hooks` registers, once per decoder module, what makes a strip's decode the whole frame's:
halos before every convolution that mixes space (``_halo``), with the whole frame's CPU kernel
(``_kernels``); the whole frame for attention (``_attention``); the whole frame's statistics for GroupNorm
(``_norms``); vector-aligned inputs for the layers whose CPU tail rounds apart (``_rounding``); and, after
each layer a pre-hook widened, the crop back to this rank's rows. Every hook acts only inside a sharded
decode of its decoder, in that decode's thread (``_context``). :func:`check_shardable` refuses, naming the
layer, what none of this can make exact.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from diffusers.models.embeddings import TimestepEmbedding
from torch import Tensor, nn

from streamvae.distributed._attention import (
    ATTENTION,
    attention_pre_hook,
    inside_whole_frame_blocks,
    whole_frame_blocks,
    whole_frame_names,
)
from streamvae.distributed._context import context_for
from streamvae.distributed._halo import conv_pre_hook, convolving, halo_rows, inner_convs
from streamvae.distributed._internals import channel_norm_dim, check_internals, injects_noise, self_padded
from streamvae.distributed._kernels import route_kernel
from streamvae.distributed._norms import wrap_group_norm
from streamvae.distributed._rounding import (
    VECTOR_ROUNDED,
    align_pre_hook,
    positions_align_pre_hook,
    positions_unalign_hook,
    unalign_hook,
)

_SPATIAL_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LocalResponseNorm)

_hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_install_lock = threading.Lock()


def install_hooks(decoder: nn.Module) -> None:
    """Register the sharding hooks on ``decoder``'s layers, once per module.

    They stay registered and do nothing outside a sharded decode of ``decoder`` in the calling thread.
    Each GroupNorm's forward is wrapped instead (a hook cannot replace a layer's computation), and each
    spatial convolution the kernel routing can matter for gets its kernel call wrapped: outside a sharded
    decode both are the layer's own. Layers inside a whole-frame block get nothing: the block gathers the
    whole frame at its entry, so they run natively on whole frames, as in the single-process decode, and it
    keeps this rank's rows at its exit.
    """
    with _install_lock:
        if decoder in _hooked:
            return
        whole_frame = whole_frame_blocks(decoder)
        skipped = inside_whole_frame_blocks(decoder) | inner_convs(decoder) | _time_embedding_layers(decoder)
        for layer in decoder.modules():
            if layer in skipped:
                continue
            conv = convolving(layer)  # a self-padding wrapper is hooked for its inner conv
            spatial = isinstance(conv, (nn.Conv2d, nn.Conv3d)) and any(k > 1 for k in conv.kernel_size[-2:])
            if spatial:
                layer.register_forward_pre_hook(conv_pre_hook(decoder), with_kwargs=True)
                route_kernel(decoder, conv)
            elif layer in whole_frame:
                layer.register_forward_pre_hook(attention_pre_hook(decoder))
            if spatial or layer in whole_frame:
                layer.register_forward_hook(_crop_hook(decoder))
            if isinstance(layer, VECTOR_ROUNDED):
                layer.register_forward_pre_hook(align_pre_hook(decoder))
                layer.register_forward_hook(unalign_hook(decoder))
            if channel_norm_dim(layer) is not None:
                layer.register_forward_pre_hook(positions_align_pre_hook(decoder))
                layer.register_forward_hook(positions_unalign_hook(decoder))
            if isinstance(layer, nn.GroupNorm):
                wrap_group_norm(layer, decoder)
        _hooked.add(decoder)


def _time_embedding_layers(decoder: nn.Module) -> set[nn.Module]:
    """Layers of the decode timestep's embedding (LTX): not a strip, the same on every rank, left alone."""
    return {
        layer
        for embedding in decoder.modules()
        if isinstance(embedding, TimestepEmbedding)
        for layer in embedding.modules()
    }


def _crop_hook(decoder: nn.Module) -> Callable[[nn.Module, tuple[Any, ...], Any], Any]:
    """After a layer whose pre-hook widened its input (halos, the whole frame): this rank's rows only."""

    def hook(layer: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        context = context_for(decoder)
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


def check_shardable(decoder: nn.Module, axis: int) -> None:
    """Raise ValueError, naming the layer, unless every layer of ``decoder`` can be sharded along ``axis``.

    Refused: convolutions whose rows do not map one to one (:func:`~streamvae.distributed._halo.halo_rows`),
    upsampling other than nearest by a whole factor, attention outside the blocks that get the whole frame
    gathered, noise drawn per call in the strip's shape (LTX's ``decoder_inject_noise``: a strip's noise is
    not the frame's rows), normalizations over space other than GroupNorm, and layers whose diffusers
    internals changed (``_internals``). Layers inside a whole-frame block run on whole frames and are not
    checked.
    """
    inside = inside_whole_frame_blocks(decoder)
    inner = inner_convs(decoder)
    for name, layer in decoder.named_modules():
        if layer in inside or layer in inner:
            continue
        try:
            check_internals(layer)
            _check_layer(layer, axis)
        except ValueError as error:
            raise ValueError(f"decoder layer {name or '(the decoder)'!r}: {error}") from None


def _check_layer(layer: nn.Module, axis: int) -> None:
    if self_padded(layer) is not None or isinstance(layer, (nn.Conv2d, nn.Conv3d)):
        halo_rows(layer, axis)
    elif isinstance(layer, nn.Upsample):
        scale = layer.scale_factor
        factors = scale if isinstance(scale, tuple) else (scale,)
        if layer.mode not in ("nearest", "nearest-exact") or any(
            f is None or float(f) != int(f) for f in factors
        ):
            # Nearest upsampling by a whole factor maps each input row to its own output rows.
            raise ValueError(f"cannot shard {layer!r}: only whole nearest upsampling is")
    elif isinstance(layer, ATTENTION):
        raise ValueError(
            f"cannot shard {type(layer).__name__}: attention mixes the whole frame, which is gathered only "
            f"for the attention of {whole_frame_names()}"
        )
    elif injects_noise(layer):
        raise ValueError(
            f"cannot shard {type(layer).__name__} with injected noise (decoder_inject_noise): it draws "
            "noise in the strip's shape on every call, which is not the whole frame's noise"
        )
    elif isinstance(layer, _SPATIAL_NORMS):
        raise ValueError(f"cannot shard {type(layer).__name__}: it normalizes over space")
    elif isinstance(layer, nn.LayerNorm) and len(layer.normalized_shape) > 1:
        raise ValueError(f"cannot shard {layer!r}: only a LayerNorm over channels is per position")
