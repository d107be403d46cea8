"""Streaming decode for diffusers' ``AutoencoderKLHunyuanVideo15`` (HunyuanVideo 1.5).

``vae.decode`` runs the whole clip through its decoder in one call (per spatial tile with ``use_tiling``);
it has no temporal tiles. But nothing in that decoder lets a frame see a later latent frame:

- every convolution over time is a ``HunyuanVideo15CausalConv3d``: it pads its input with two copies of the
  first frame in front (``replicate``) and none behind, so an output frame reads its input frame and the
  two before;
- the one attention (in the mid block, at latent resolution) is causal over frames: its mask lets a token
  attend to every token of its own and earlier latent frames;
- the norms are RMS norms over channels alone (no GroupNorm over time, which would mix all frames of the
  call), and the rest (SiLU, 1×1 convolutions, the channel↔space/time rearranges of the upsamplers, the
  skip connections) acts frame by frame;
- each temporal upsampler treats the call's first frame apart (it becomes one frame, every later one two).

So the decoder can run one latent frame at a time with a cache, which is what this adapter does: each causal
convolution keeps the last two frames of its padded input and puts them in front of the next step's frames
(the first step pads as diffusers does); the attention keeps the keys and values of earlier latent frames,
and the step's queries (one latent frame) attend to all of them and to their own frame, which is the mask's
row for that frame; the temporal upsamplers treat only the first step's frame as the first. Step ``k``'s
frames (1 for the first latent frame, then ``temporal_compression_ratio`` a latent frame) are final the
moment it ends, and leave as one chunk. With spatial tiling, every tile walks the same way with its own
caches, and each step's tiles are blended as ``tiled_decode`` blends them (the blend is elementwise per
frame).

The caches live in the walk of one decode (``_CausalWalk``), never on the VAE's modules: the walk calls
the decoder's submodules itself and reads only their weights and settings.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (
    AutoencoderKLHunyuanVideo15,
    HunyuanVideo15AttnBlock,
    HunyuanVideo15CausalConv3d,
    HunyuanVideo15Decoder3D,
    HunyuanVideo15ResnetBlock,
    HunyuanVideo15Upsample,
)
from torch import Tensor

from streamvae.models._base import ChunkedDecoder
from streamvae.models._common import blend_tiles, uses_spatial_tiling

__all__ = ["HunyuanVideo15ChunkedDecoder"]


class HunyuanVideo15ChunkedDecoder(ChunkedDecoder):
    """Publishes each latent frame's video frames of a HunyuanVideo 1.5 decode as soon as it is decoded.

    ``streams`` is True: the decoder is causal in time, so it runs one latent frame a step with a cache
    (module docstring). Step by step is not operation for operation: a convolution over a few frames may
    round differently from the same one over the whole clip, so the concatenated chunks are not always
    ``torch.equal`` to ``vae.decode(z).sample``. Measured on CPU (tiny random VAEs, 1 to 9 latent frames,
    with and without spatial tiling and batches): max ``|Δ|`` 5e-6 in float32, where values span about ±3 and
    one uint8 level is 2/255 ≈ 7.8e-3; ``torch.equal`` in bfloat16 and float16, and for a single latent
    frame. On CUDA the convolutions' algorithms may differ by frame count too (not measured here). The same
    ``use_tiling`` (``tile_latent_min_height`` / ``_width``, ``tile_overlap_factor``) and ``use_slicing``
    settings apply as in ``vae.decode``.

    A batch of several entries without ``use_slicing``: diffusers' ``decode`` raises there (diffusers
    0.42.1 expands its attention mask over the batch, which then broadcasts against the heads dimension);
    this adapter decodes the batch together, each entry as ``vae.decode`` decodes it alone (within the
    float noise above).

    Memory: one step's activations (one latent frame's, up to ``temporal_compression_ratio`` frames at full
    resolution) instead of the whole clip's; the cache is two frames per causal convolution and the
    attention's keys and values of every latent frame so far (latent resolution). The attention mask is one
    latent frame's rows, not the ``(T·H·W)²`` mask ``vae.decode`` builds. Chunks are in [-1, 1] nominally
    (the decoder does not clamp; the pipelines' post-processing does).
    """

    vae: AutoencoderKLHunyuanVideo15
    vae_classes = (AutoencoderKLHunyuanVideo15,)
    channels_key = "latent_channels"

    def output_frames(self, latent_frames: int) -> int:
        """``1 + temporal_compression_ratio · (latent_frames − 1)``, as ``vae.decode`` gives."""
        return 1 + int(self.vae.temporal_compression_ratio) * (latent_frames - 1)

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        vae = self.vae
        height, width = z.shape[-2:]
        latent_tile = (int(vae.tile_latent_min_height), int(vae.tile_latent_min_width))
        if not uses_spatial_tiling(vae, height, width, latent_tile=latent_tile):
            walk = _CausalWalk(vae.decoder)
            for k in range(z.shape[2]):
                yield walk.step(z[:, :, k : k + 1])
            return
        # diffusers' tiled_decode: latent tiles every min × (1 − overlap), blended over sample min × overlap.
        tile_height, tile_width = latent_tile
        stride_height = int(tile_height * (1 - vae.tile_overlap_factor))
        stride_width = int(tile_width * (1 - vae.tile_overlap_factor))
        blend = (
            int(vae.tile_sample_min_height * vae.tile_overlap_factor),
            int(vae.tile_sample_min_width * vae.tile_overlap_factor),
        )
        keep = (vae.tile_sample_min_height - blend[0], vae.tile_sample_min_width - blend[1])
        tiles = [
            [
                (z[:, :, :, i : i + tile_height, j : j + tile_width], _CausalWalk(vae.decoder))
                for j in range(0, width, stride_width)
            ]
            for i in range(0, height, stride_height)
        ]
        for k in range(z.shape[2]):
            rows = [[walk.step(tile[:, :, k : k + 1]) for tile, walk in row] for row in tiles]
            yield blend_tiles(vae, rows, blend=blend, keep=keep)


class _CausalWalk:
    """One decode's walk through a ``HunyuanVideo15Decoder3D``, one latent frame a step.

    Repeats the decoder's forward operation for operation, module by module, except where a step needs what
    an earlier step computed: the causal convolutions' last input frames and the attention's keys and
    values, kept here. Reads the modules' weights and settings, changes nothing on them.
    """

    def __init__(self, decoder: HunyuanVideo15Decoder3D) -> None:
        self.decoder = decoder
        self.first = True  # whether the step holds the clip's first latent frame
        self.past_frames: dict[HunyuanVideo15CausalConv3d, Tensor] = {}
        self.past_keys: dict[HunyuanVideo15AttnBlock, tuple[Tensor, Tensor]] = {}

    def step(self, z: Tensor) -> Tensor:
        """Decode the next latent frame ``z`` [B, C, 1, H, W]: ``HunyuanVideo15Decoder3D.forward`` on it,
        given the past (a step of one latent frame is what lets the attention mask nothing)."""
        decoder: Any = self.decoder  # its ModuleLists are typed as holding any Module
        hidden = self.conv(decoder.conv_in, z) + z.repeat_interleave(repeats=decoder.repeat, dim=1)
        mid = decoder.mid_block
        hidden = self.resnet(mid.resnets[0], hidden)
        for attention, resnet in zip(mid.attentions, mid.resnets[1:], strict=True):
            if attention is not None:
                hidden = self.attention(attention, hidden)
            hidden = self.resnet(resnet, hidden)
        for up_block in decoder.up_blocks:
            for resnet in up_block.resnets:
                hidden = self.resnet(resnet, hidden)
            for upsampler in up_block.upsamplers or ():
                hidden = self.upsample(upsampler, hidden)
        hidden = decoder.norm_out(hidden)
        hidden = decoder.conv_act(hidden)
        hidden = self.conv(decoder.conv_out, hidden)
        self.first = False
        return hidden

    def conv(self, module: HunyuanVideo15CausalConv3d, x: Tensor) -> Tensor:
        """``HunyuanVideo15CausalConv3d.forward``: the first step pads in front with copies of its first
        frame; a later one puts the past step's last padded frames there instead."""
        padding = module.time_causal_padding  # (left, right, top, bottom, front, back=0)
        past = self.past_frames.get(module)
        if past is None:
            padded = F.pad(x, padding, mode=module.pad_mode)
        else:
            # Replicate padding is separable: a frame padded in space alone equals that frame of the clip
            # padded in space and time.
            padded = torch.cat([past, F.pad(x, (*padding[:4], 0, 0), mode=module.pad_mode)], dim=2)
        context = padding[4]
        self.past_frames[module] = padded[:, :, padded.shape[2] - context :].clone()
        out: Tensor = module.conv(padded)
        return out

    def resnet(self, block: HunyuanVideo15ResnetBlock, hidden: Tensor) -> Tensor:
        """``HunyuanVideo15ResnetBlock.forward``."""
        residual = hidden
        hidden = self.conv(block.conv1, block.nonlinearity(block.norm1(hidden)))
        hidden = self.conv(block.conv2, block.nonlinearity(block.norm2(hidden)))
        if block.conv_shortcut is not None:
            residual = block.conv_shortcut(residual)
        return hidden + residual

    def attention(self, block: HunyuanVideo15AttnBlock, x: Tensor) -> Tensor:
        """``HunyuanVideo15AttnBlock.forward`` for one latent frame: its mask row lets the frame's tokens
        attend to every token of the earlier frames (the cached keys and values) and of their own."""
        identity = x
        x = block.norm(x)
        query = _tokens(block.to_q(x))
        key = _tokens(block.to_k(x))
        value = _tokens(block.to_v(x))
        past = self.past_keys.get(block)
        if past is not None:
            key = torch.cat([past[0], key], dim=2)
            value = torch.cat([past[1], value], dim=2)
        self.past_keys[block] = (key, value)
        # No token is masked, but a zero mask of the shape diffusers passes keeps scaled_dot_product_attention
        # on the kernel diffusers' call takes (without one it takes another, which rounds differently).
        mask = query.new_zeros(1, query.shape[2], key.shape[2])
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        batch, channels, frames, height, width = x.shape
        out = attended.squeeze(1).reshape(batch, frames, height, width, channels).permute(0, 4, 1, 2, 3)
        projected: Tensor = block.proj_out(out)
        return projected + identity

    def upsample(self, block: HunyuanVideo15Upsample, x: Tensor) -> Tensor:
        """``HunyuanVideo15Upsample.forward``; only the first step holds the clip's first frame, which a
        temporal upsampler turns into one frame (with half the packed channels), every other into two."""
        h = self.conv(block.conv, x)
        if not block.add_temporal_upsample:
            h = _unpack(h, 1)
            shortcut = _unpack(x.repeat_interleave(repeats=block.repeats, dim=1), 1)
            return h + shortcut
        if not self.first:
            h = _unpack(h, 2)
            shortcut = _unpack(x, 2).repeat_interleave(repeats=block.repeats, dim=1)
            return h + shortcut
        h_first = _unpack(h[:, :, :1], 1)
        h_first = h_first[:, : h_first.shape[1] // 2]
        h = torch.cat([h_first, _unpack(h[:, :, 1:], 2)], dim=2)
        x_first = _unpack(x[:, :, :1], 1).repeat_interleave(repeats=block.repeats // 2, dim=1)
        x_next = _unpack(x[:, :, 1:], 2).repeat_interleave(repeats=block.repeats, dim=1)
        return h + torch.cat([x_first, x_next], dim=2)


def _tokens(x: Tensor) -> Tensor:
    """[B, C, T, H, W] → [B, 1, T·H·W, C], as ``HunyuanVideo15AttnBlock.forward`` lays out its tokens."""
    batch, channels, frames, height, width = x.shape
    flat = x.reshape(batch, channels, frames * height * width).permute(0, 2, 1)
    return flat.unsqueeze(1).contiguous()


def _unpack(tensor: Tensor, frames_factor: int) -> Tensor:
    """``HunyuanVideo15Upsample._dcae_upsample_rearrange(tensor, r1=frames_factor, r2=2, r3=2)``:
    (b, r1·2·2·c, f, h, w) → (b, c, r1·f, 2h, 2w). Repeated here (it only moves values) rather than
    calling the private helper."""
    batch, packed, frames, height, width = tensor.shape
    channels = packed // (frames_factor * 4)
    tensor = tensor.view(batch, frames_factor, 2, 2, channels, frames, height, width)
    tensor = tensor.permute(0, 4, 5, 1, 6, 2, 7, 3)
    return tensor.reshape(batch, channels, frames * frames_factor, height * 2, width * 2)
