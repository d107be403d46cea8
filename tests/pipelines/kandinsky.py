"""Kandinsky 5 and 6 builders: text and image to video (Kandinsky 6 with sound) with the HunyuanVideo VAE
``tiny_hunyuan_video`` (the pipelines read its ``temporal_compression_ratio`` 4, ``spatial_compression_ratio``
8 and ``scaling_factor``); one decode after the loop, latents kept channels-last ``[B, T, h, w, C]``. And
Kandinsky 6's super-resolution, with its own K-VAE (``Kandinsky6SRVAE``): tiles decoded, then blended."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    Kandinsky5I2VPipeline,
    Kandinsky5T2VPipeline,
    Kandinsky5Transformer3DModel,
    Kandinsky6SRLatentUpscalerBank,
    Kandinsky6SRPipeline,
    Kandinsky6SRTransformer3DModel,
    Kandinsky6SRVAE,
    Kandinsky6TI2VAPipeline,
    Kandinsky6Transformer3DModel,
    MMAudioVAE,
    MMAudioVocoder,
)

from tests._vaes import tiny_hunyuan_video
from tests.pipelines._shared import (
    TEXT_TOKENS,
    ExpectedAudio,
    MakeKwargs,
    Pipeline,
    builder,
    call_kwargs,
    pipeline,
    randn,
    seeded,
    video_kwargs,
)

_KANDINSKY_QWEN_DIM = 16
_KANDINSKY_CLIP_DIM = 32
#: diffusers' tiny Kandinsky 5 transformer (tests/pipelines/kandinsky5).
_KANDINSKY_TRANSFORMER: dict[str, Any] = {
    "in_visual_dim": 4,
    "in_text_dim": _KANDINSKY_QWEN_DIM,
    "in_text_dim2": _KANDINSKY_CLIP_DIM,
    "time_dim": 32,
    "out_visual_dim": 4,
    "patch_size": (1, 2, 2),
    "model_dim": 48,
    "ff_dim": 128,
    "num_text_blocks": 1,
    "num_visual_blocks": 1,
    "axes_dims": (8, 8, 8),
    "visual_cond": False,
}


def _kandinsky_prompt() -> dict[str, Any]:
    """Qwen embeddings [1, 16, 16], a pooled CLIP embedding [1, 32] and the Qwen ``cu_seqlens`` [0, 16], for
    the prompt (seeds 1, 2) and the negative prompt (seeds 3, 4)."""
    kwargs: dict[str, Any] = {}
    for prefix, seed in (("", 1), ("negative_", 3)):
        kwargs[f"{prefix}prompt_embeds_qwen"] = randn(1, TEXT_TOKENS, _KANDINSKY_QWEN_DIM, seed=seed)
        kwargs[f"{prefix}prompt_embeds_clip"] = randn(1, _KANDINSKY_CLIP_DIM, seed=seed + 1)
        kwargs[f"{prefix}prompt_cu_seqlens"] = torch.tensor([0, TEXT_TOKENS], dtype=torch.int32)
    return kwargs


def _kandinsky(pipeline_class: Any, **transformer: Any) -> Pipeline:
    return pipeline(
        pipeline_class,
        vae=tiny_hunyuan_video(),
        transformer=seeded(Kandinsky5Transformer3DModel, {**_KANDINSKY_TRANSFORMER, **transformer}),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 3, 4, 4, 4))
def kandinsky5_t2v() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 5 text-to-video with the HunyuanVideo VAE ``tiny_hunyuan_video``: 32×32, 9 frames → one
    ``vae.decode`` of [1, 4, 3, 4, 4]; the ``"latent"`` output is channels-last [1, 3, 4, 4, 4]
    (``[B, T, h, w, C]``)."""
    return _kandinsky(Kandinsky5T2VPipeline), video_kwargs(32, 5.0, _kandinsky_prompt)


@builder(frames=(1, 17, 32, 32, 3), latents=(1, 5, 4, 4, 4))
def kandinsky5_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 5 image to video (:func:`kandinsky5_t2v`'s transformer with ``visual_cond``: noise, a zero
    condition and a first-frame mask in; ``tiny_hunyuan_video``): a 32×32 image, 17 frames → ``vae.encode``
    of the image (sampled from the call's generator), its latent the first of [1, 5, 4, 4, 4] (channels
    last), not denoised. After the loop the pipeline re-normalizes the first 4 latent frames to the mean
    and std of the (up to 5) after them (``normalize_first_frame``, also for the ``"latent"`` output
    [1, 5, 4, 4, 4]), then one ``vae.decode`` of [1, 4, 5, 4, 4] → 17 frames.

    ``num_frames`` must be 17 or more: with 4 latent frames or fewer there are none after the first 4,
    their std is NaN, and so is every pixel (diffusers 0.42.1). About 0.25 s a call on 2 CPU cores; no
    audio."""
    pipe = _kandinsky(Kandinsky5I2VPipeline, visual_cond=True)
    return pipe, video_kwargs(32, 5.0, _kandinsky_prompt, image=True, num_frames=17)


# -- Kandinsky 6: text (and image) to video and sound --

_K6_QWEN_DIM = 32
_K6_CLIP_DIM = 16
#: diffusers' tiny Kandinsky 6 transformer (tests/pipelines/kandinsky6), with tiny_hunyuan_video's 4 channels
_K6_TRANSFORMER: dict[str, Any] = {
    "in_visual_dim": 4,
    "out_visual_dim": 4,
    "in_text_dim": _K6_QWEN_DIM,
    "in_text_dim2": _K6_CLIP_DIM,
    "time_dim": 16,
    "patch_size": (1, 2, 2),
    "model_dim": 12,
    "ff_dim": 24,
    "num_text_blocks": 1,
    "num_visual_blocks": 2,
    "axes_dims": (2, 1, 1),
    "visual_cond": True,
    "in_audio_dim": 4,
    "out_audio_dim": 4,
    "visual_token_type_num_embeddings": 2,
}
#: diffusers' tiny MMAudio VAE at 8 kHz, a rate AAC takes (its 64 Hz there is too low to mux): the
#: soundtrack is ``(frames / frame_rate) · sample_rate / hop`` latent frames, each ``hop`` samples
_K6_AUDIO_VAE: dict[str, Any] = {
    "mel_bins": 8,
    "latent_channels": 4,
    "hidden_channels": 8,
    "channel_multipliers": (1, 2),
    "layers_per_block": 1,
    "sample_rate": 8000,
    "n_fft": 16,
    "hop_length": 4,
}
#: diffusers' tiny MMAudio vocoder (its upsampling, 2 · 2, is the VAE's hop)
_K6_VOCODER: dict[str, Any] = {
    "num_mels": 8,
    "upsample_initial_channel": 8,
    "upsample_rates": (2, 2),
    "upsample_kernel_sizes": (4, 4),
    "resblock_kernel_sizes": (3,),
    "resblock_dilation_sizes": ((1, 3),),
}


def _k6_prompt() -> dict[str, Any]:
    """Qwen embeddings [1, 16, 32] and a pooled CLIP embedding [1, 16], for the prompt (seeds 1, 2) and the
    negative prompt (seeds 3, 4)."""
    kwargs: dict[str, Any] = {}
    for prefix, seed in (("", 1), ("negative_", 3)):
        kwargs[f"{prefix}prompt_embeds"] = randn(1, TEXT_TOKENS, _K6_QWEN_DIM, seed=seed)
        kwargs[f"{prefix}pooled_prompt_embeds"] = randn(1, _K6_CLIP_DIM, seed=seed + 1)
    return kwargs


# ``audio``: ``.audio`` is [batch, samples], mono without a channel axis; its latents channels-first
@builder(
    frames=(1, 9, 16, 16, 3),
    latents=(1, 4, 3, 2, 2),
    audio=ExpectedAudio(shape=(1, 3000), sample_rate=8000, latents=(1, 4, 375)),
)
def kandinsky6() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 6 text to video and sound (``tiny_hunyuan_video``, diffusers' tiny transformer, MMAudio VAE
    and vocoder; no text encoders: Qwen embeddings and a pooled CLIP embedding): 16×16, 9 frames at its
    default 24 fps → one ``vae.decode(latents / scaling_factor, return_dict=False)`` of [1, 4, 3, 2, 2]
    (the latents, channels-last while denoised, permuted back) → ``.frames`` [1, 9, 16, 16, 3]; then the
    audio VAE and the vocoder → ``.audio`` [1, 3000], mono at 8 kHz (9 / 24 s)."""
    pipe = pipeline(
        Kandinsky6TI2VAPipeline,
        vae=tiny_hunyuan_video(),
        transformer=seeded(Kandinsky6Transformer3DModel, _K6_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        audio_vae=seeded(MMAudioVAE, _K6_AUDIO_VAE),
        vocoder=seeded(MMAudioVocoder, _K6_VOCODER),
    )
    return pipe, video_kwargs(16, 5.0, _k6_prompt)


@builder(
    frames=(1, 9, 16, 16, 3),
    latents=(1, 4, 3, 2, 2),
    audio=ExpectedAudio(shape=(1, 3000), sample_rate=8000, latents=(1, 4, 375)),
)
def kandinsky6_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 6 image to video and sound (:func:`kandinsky6`'s parts): a 16×16 noise image
    ``vae.encode``d (sampled from the call's generator) and appended as a masked extra latent frame, which
    the pipeline drops after its loop; then the same decodes as :func:`kandinsky6` → ``.frames``
    [1, 9, 16, 16, 3] and ``.audio`` [1, 3000]."""
    pipe, _ = kandinsky6()
    return pipe, video_kwargs(16, 5.0, _k6_prompt, image=True)


# -- Kandinsky 6 super-resolution: run to its end, its blended canvas encoded --

#: diffusers' tiny Kandinsky 6 SR models (tests/pipelines/kandinsky6): a transformer trained at tiles of
#: 32×32, 32×64 and 64×32, a K-VAE of 4× in time and space, a latent upscaler bank for 2× and 4×
_K6_SR_TRANSFORMER: dict[str, Any] = {
    "in_visual_dim": 4,
    "out_visual_dim": 4,
    "time_dim": 16,
    "patch_size": (1, 1, 1),
    "model_dim": 24,
    "ff_dim": 32,
    "num_visual_blocks": 2,
    "axes_dims": (4, 4, 4),
    "tile_sizes": ((32, 32), (32, 64), (64, 32)),
}
_K6_SR_VAE: dict[str, Any] = {
    "latent_channels": 4,
    "encoder_block_out_channels": (4, 8, 8),
    "decoder_block_out_channels": (4, 8, 8),
    "layers_per_block": 1,
    "temporal_compression_ratio": 4,
    "temporal_compression_start_level": 0,
}
_K6_SR_UPSCALER: dict[str, Any] = {
    "in_channels": 4,
    "stage_channels": (8, 8, 4),
    "num_pre_blocks": 1,
    "num_mid_blocks": 1,
    "num_post_blocks": 1,
    "num_x2_adapter_blocks": 1,
    "scales": (2, 4),
}


def _low_resolution_video(kwargs: dict[str, Any]) -> None:
    kwargs.setdefault("video", torch.rand((5, 3, 16, 24), generator=torch.Generator().manual_seed(3)))


# no latent output: ``latents`` is what each tile's decode takes, [1, 4, 2, 8, 8] (a 32×32 tile)
@builder(frames=(1, 5, 32, 48, 3), latents=(1, 4, 2, 8, 8))
def kandinsky6_sr() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 6 super-resolution, 2× (diffusers' tiny models; a ``Kandinsky6SRVAE``): a 5-frame 16×24
    video in [0, 1], ``vae.encode``d whole, its latents cut into overlapping tiles and upscaled in latent
    space (here two 16×16 tiles, 8 pixels apart, each 32×32 at the output); each batch of tiles (here one
    tile a batch: two ``vae.decode`` calls of [1, 4, 2, 8, 8]) is denoised, then decoded and rescaled
    (``(x + 1) · 128 / 127.5 − 1``, clamped), and the tiles are blended into the output canvas with Hann
    windows, 16 columns of it from both → ``.frames`` [1, 5, 32, 48, 3]. Its first call takes about 2 s on
    2 busy CPU cores (PyTorch's eager flex attention, set up per shape), each later one about 0.5 s."""
    pipe = pipeline(
        Kandinsky6SRPipeline,
        transformer=seeded(Kandinsky6SRTransformer3DModel, _K6_SR_TRANSFORMER),
        vae=seeded(Kandinsky6SRVAE, _K6_SR_VAE),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.5),
        latent_upscaler=seeded(Kandinsky6SRLatentUpscalerBank, _K6_SR_UPSCALER),
    )
    make_kwargs = call_kwargs(
        _no_embeddings,
        finish=_low_resolution_video,
        resolution_scale=2,
        min_overlap=0.2,
        tiles_batch_size=1,
    )
    return pipe, make_kwargs


def _no_embeddings() -> dict[str, Any]:
    return {}
