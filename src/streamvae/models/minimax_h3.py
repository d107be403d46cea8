"""Streaming decode for diffusers' ``AutoencoderKLMiniMaxH3`` (MiniMax-H3's video VAE).

MiniMax-H3's decoder is a non-causal ViT: every latent of a call attends to every other, so nothing in one
decoder call is final before the whole call is. ``vae.decode`` therefore walks time in clips. With the
released geometry (``clip_length`` 17, ``token_drop`` 3, 4× temporal compression) a clip is
``tokens_chunk_size + token_overlap`` = 5 + 2 latent frames, clips start every 5 latents, and each clip
decodes to 28 pixel frames: its first 20 (less the ``frame_pre_padding`` of 3) are the clip's *head*, 17
frames, and frames 23–27 its *tail* (``frame_overlap``, 5 frames). The tail of one clip is cross-faded into
the first 5 frames of the next clip's head (``vae._blend``); the last clip's tail ends the video. A latent
that is not a whole number of clips is padded by repeating its last frame, and the pixel frames of the
padding are cut off the end.

So a clip's head is final as soon as the clip is decoded: it reads only this clip and the previous one's
tail, and no later clip touches it. The tail waits for the next clip, and the last tail goes at the end.
:class:`MiniMaxH3ChunkedDecoder` decodes clip by clip and publishes each head right away, then the last
tail; the frame count is known from the latent length, so padding frames are trimmed as the walk reaches
them and never published. Spatial tiling, on by default, happens inside each clip, as in diffusers.

diffusers internals used (all of ``AutoencoderKLMiniMaxH3``, checked when the adapter is made):

- ``_decode_clip(z)``: one clip's decode, spatially tiled as ``vae.decode`` tiles it (``_split_tiles``,
  ``_stitch_tiles`` and ``use_tiling`` stay diffusers' own). Called, not copied, so it cannot drift.
- ``_blend(a, b, extent, dim)``: the cross-fade of a tail into the next head. Called for the same reason.
- The pad-frame arithmetic at the end of ``_decode`` (a clip's last latent frame gives
  ``clip_length % temporal_compression_ratio`` pixel frames) is repeated in
  :meth:`MiniMaxH3ChunkedDecoder.output_frames`, because the walk must know where the video ends before
  it gets there; tests compare it with ``vae.decode`` for every latent length up to several clips.
"""

from __future__ import annotations

from collections.abc import Generator

import torch
from diffusers.models.autoencoders.autoencoder_kl_minimax_h3 import AutoencoderKLMiniMaxH3
from diffusers.models.modeling_utils import get_parameter_dtype
from torch import Tensor

from streamvae._quantize import PerChannelRange
from streamvae.models._base import ChunkedDecoder
from streamvae.models._common import execution_device

__all__ = ["IMAGENET_RANGE", "MiniMaxH3ChunkedDecoder"]

#: MiniMax-H3's pixel normalization: ImageNet's, as ``MiniMaxH3ModularPipeline.pixel_mean`` / ``pixel_std``
IMAGENET_RANGE = PerChannelRange(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

_PRIVATE_METHODS = ("_decode_clip", "_blend")  # the diffusers internals the walk calls


class MiniMaxH3ChunkedDecoder(ChunkedDecoder):
    """Publishes each clip of an ``AutoencoderKLMiniMaxH3`` decode as soon as no later clip can change it.

    Chunks are the clips' heads (17 frames with the released geometry), then the last clip's tail (5),
    trimmed where the latent was padded. Concatenated they are ``torch.equal`` to ``vae.decode(z).sample``
    with the instance's settings (``use_tiling`` and the tile sizes, ``use_slicing``): the adapter runs the
    same operations in the same order. ``streams`` is True.

    Chunks hold ImageNet-normalized pixels, ``(pixel - mean) / std`` over [0, 1], which
    ``chunk_value_range`` (a :class:`~streamvae.PerChannelRange`) maps back as the modular pipeline does:
    ``(x * std + mean).clamp(0, 1)``. ``pixel_mean`` / ``pixel_std`` (three numbers each, R G B) replace
    ImageNet's for a pipeline whose ``pixel_mean`` / ``pixel_std`` components differ.

    Latents need :attr:`min_latent_frames` frames at least, ``1 + tokens_chunk_size - token_drop`` (3 for
    the released geometry) when ``token_drop`` is less than a clip: ``vae.decode`` fails on fewer (it has no
    clip to decode), and :meth:`check_latents` refuses them.

    Memory: one clip's decode and the previous clip's tail at a time (per batch entry with
    ``use_slicing``), where ``vae.decode`` holds every clip's frames until it joins them into the video.
    """

    vae: AutoencoderKLMiniMaxH3
    vae_classes = (AutoencoderKLMiniMaxH3,)
    channels_key = "latent_channels"
    chunk_value_range: PerChannelRange = IMAGENET_RANGE

    def __init__(
        self,
        vae: AutoencoderKLMiniMaxH3,
        *,
        pixel_mean: tuple[float, float, float] | None = None,
        pixel_std: tuple[float, float, float] | None = None,
        drain: bool = False,
    ) -> None:
        super().__init__(vae, drain=drain)
        missing = [name for name in _PRIVATE_METHODS if not callable(getattr(vae, name, None))]
        if missing:  # no fallback: the clip walk is these methods
            raise TypeError(
                f"{type(self).__name__} needs AutoencoderKLMiniMaxH3.{' and .'.join(missing)}, which this "
                "diffusers version does not have; the adapter was written against diffusers 0.42"
            )
        if pixel_mean is not None or pixel_std is not None:
            self.chunk_value_range = PerChannelRange(
                mean=IMAGENET_RANGE.mean if pixel_mean is None else pixel_mean,
                std=IMAGENET_RANGE.std if pixel_std is None else pixel_std,
            )

    @property
    def streams(self) -> bool:
        """True: each clip's head leaves once the clip is decoded."""
        return True

    @property
    def min_latent_frames(self) -> int:
        """The fewest latent frames ``vae.decode`` decodes: one clip must start before the dropped tokens."""
        token_drop = int(self.vae.config["token_drop"])
        if token_drop == 0:
            return 1
        return max(1, int(self.vae.tokens_chunk_size) - token_drop + 1)

    def check_latents(self, z: object, *, owner: str | None = None) -> None:
        """The base's checks, and at least :attr:`min_latent_frames` frames (ValueError naming ``z``)."""
        super().check_latents(z, owner=owner)
        assert isinstance(z, Tensor)
        if z.shape[2] < self.min_latent_frames:
            raise ValueError(
                f"{owner or type(self).__name__}: z must have at least {self.min_latent_frames} latent "
                f"frames (AutoencoderKLMiniMaxH3 decodes whole clips), got shape {tuple(z.shape)}"
            )

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Check ``z`` and cast it as ``vae.decode`` does: to the dtype of ``post_quant_conv``, the first
        module to read it (the VAE is mixed precision), on the execution device."""
        self.check_latents(z)
        return z.to(device=execution_device(self.vae), dtype=get_parameter_dtype(self.vae.post_quant_conv))

    def output_frames(self, latent_frames: int) -> int | None:
        """The frames ``vae.decode`` gives for ``latent_frames`` (None for fewer than it decodes):
        ``_decode``'s clip heads and last tail, less the frames of the padding latents."""
        if latent_frames < self.min_latent_frames:
            return None
        vae = self.vae
        pad_tokens, num_clips = self._clips(latent_frames)
        clip_tokens = int(vae.tokens_chunk_size)
        ratio = int(vae.temporal_compression_ratio)
        frames = num_clips * (clip_tokens * ratio - vae.frame_pre_padding)
        if vae.config["token_drop"] > 0:
            frames += vae.frame_overlap
        # A clip's last latent frame gives clip_length % ratio frames (when that is not 0), the others ratio.
        intra_tail = int(vae.config["clip_length"]) % ratio
        pad_frames = sum(
            intra_tail if intra_tail and (latent_frames + k) % clip_tokens == 0 else ratio
            for k in range(pad_tokens)
        )
        return max(frames - pad_frames, 0)

    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        vae = self.vae
        clip_tokens = int(vae.tokens_chunk_size)
        clip_frames = clip_tokens * int(vae.temporal_compression_ratio)
        has_tails = vae.config["token_drop"] > 0
        remaining = self.output_frames(z.shape[2])
        assert remaining is not None  # check_latents ran
        pad_tokens, num_clips = self._clips(z.shape[2])
        if pad_tokens > 0:  # as _decode pads: the last latent frame repeated
            z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad_tokens, 1, 1)], dim=2)

        tail: Tensor | None = None
        for i in range(num_clips):
            start = i * clip_tokens
            clip = vae._decode_clip(z[:, :, start : start + clip_tokens + vae.token_overlap])
            head = clip[:, :, :clip_frames][:, :, vae.frame_pre_padding :]
            if tail is not None:
                head = vae._blend(tail, head, vae.frame_overlap, dim=-3)
            if has_tails:
                # Cloned, so this clip's decode is freed once its head is taken, not held until the next one.
                tail = clip[:, :, clip_frames : 2 * clip_frames][:, :, vae.frame_pre_padding :].clone()
            del clip
            head = head[:, :, :remaining]  # frames past the end come from padding latents
            remaining -= head.shape[2]
            if head.shape[2] > 0:
                yield head
        if tail is not None and remaining > 0:
            yield tail[:, :, :remaining]

    def _clips(self, latent_frames: int) -> tuple[int, int]:
        """``_decode``'s padding latents and clip count for ``latent_frames``, unchanged."""
        clip_tokens = int(self.vae.tokens_chunk_size)
        token_drop = int(self.vae.config["token_drop"])
        num_tokens = latent_frames + token_drop
        pad_tokens = (-num_tokens) % clip_tokens
        return pad_tokens, (num_tokens + pad_tokens) // clip_tokens - int(token_drop > 0)
