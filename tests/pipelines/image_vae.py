"""The pipelines that decode video frame by frame with an image VAE (``AutoencoderKL``): AnimateDiff (text,
ControlNet, PAG, SDXL, SparseCtrl), I2VGenXL, PIA and text-to-video SD.

Each denoises BCFHW latents, and its ``decode_latents`` flattens them into ``[B·F, C, h, w]`` and calls
``vae.decode`` on ``decode_chunk_size`` frames at a time (AnimateDiff, ControlNet, PAG, I2VGenXL) or on all
of them at once (SDXL, SparseCtrl, PIA, text-to-video SD). The builders that take a ``decode_chunk_size``
call with 3 over 4 frames: two calls, of 3 and 1 frames. Every model is diffusers' own test config of its
family (``get_dummy_components`` of tests/pipelines/animatediff, pag, i2vgen_xl, pia and
text_to_video_synthesis), seeded, with prompt embeddings instead of the CLIP text encoders; 16×16 frames,
4 of them, 2 steps, no audio.
"""

from __future__ import annotations

from typing import Any

from diffusers import (
    AnimateDiffControlNetPipeline,
    AnimateDiffPAGPipeline,
    AnimateDiffPipeline,
    AnimateDiffSDXLPipeline,
    AnimateDiffSparseControlNetPipeline,
    AutoencoderKL,
    ControlNetModel,
    DDIMScheduler,
    I2VGenXLPipeline,
    MotionAdapter,
    PIAPipeline,
    SparseControlNetModel,
    TextToVideoSDPipeline,
    UNet2DConditionModel,
    UNet3DConditionModel,
)
from diffusers.models.unets import I2VGenXLUNet
from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModelWithProjection

from tests.pipelines._shared import (
    MakeKwargs,
    Pipeline,
    Prompt,
    builder,
    noise_frames,
    pipeline,
    prompt_pair,
    randn,
    seeded,
    unet_config,
    video_kwargs,
)

SIZE, FRAMES = 16, 4
#: AnimateDiff's own chunk (16 by default) made smaller than the video: decode_latents calls vae.decode twice
DECODE_CHUNK = 3
#: frames [1, 4, 16, 16, 3]; BCFHW latents of a VAE 2× in space (two blocks) and of one 1× (one block)
_FRAMES = (1, FRAMES, SIZE, SIZE, 3)
_LATENTS_2X = (1, 4, FRAMES, SIZE // 2, SIZE // 2)
_LATENTS_1X = (1, 4, FRAMES, SIZE, SIZE)


def _autoencoder_kl(*widths: int, **extra: Any) -> dict[str, Any]:
    """The config of diffusers' test ``AutoencoderKL``: one encoder and decoder block a width, RGB in and
    out, 4 latent channels (2× smaller in space for each block past the first), then ``extra``."""
    return {
        "block_out_channels": widths,
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ("DownEncoderBlock2D",) * len(widths),
        "up_block_types": ("UpDecoderBlock2D",) * len(widths),
        "latent_channels": 4,
        **extra,
    }


#: diffusers' AnimateDiff / PIA VAE (two blocks, 2× in space).
_VAE_32_64 = _autoencoder_kl(32, 64)
#: diffusers' AnimateDiff ControlNet / SparseCtrl / PAG VAE (two blocks of 8, 2× in space).
_VAE_8_8 = _autoencoder_kl(8, 8, norm_num_groups=2)
#: diffusers' text-to-video SD / I2VGenXL VAE (one block, 1× in space).
_VAE_8 = _autoencoder_kl(8, sample_size=32, norm_num_groups=2)
#: diffusers' AnimateDiff / PIA UNet and motion adapter (cross attention 32).
_UNET_32_64 = unet_config(
    (32, 64),
    ("CrossAttnDownBlock2D", "DownBlock2D"),
    ("CrossAttnUpBlock2D", "UpBlock2D"),
    cross_attention_dim=32,
    norm_num_groups=2,
)
_MOTION: dict[str, Any] = {
    "motion_layers_per_block": 2,
    "motion_norm_num_groups": 2,
    "motion_num_attention_heads": 4,
}
#: diffusers' AnimateDiff ControlNet / SparseCtrl / PAG UNet (blocks of 8, cross attention 8).
_UNET_8_8: dict[str, Any] = {
    **_UNET_32_64,
    "block_out_channels": (8, 8),
    "sample_size": 8,
    "cross_attention_dim": 8,
}
#: diffusers' AnimateDiff ControlNet / SparseCtrl ControlNet: :data:`_UNET_8_8`'s blocks, whose outputs it
#: adds to, over a conditioning embedding of 8 and 8 channels; each adds its own down blocks.
_CONTROLNET_8_8: dict[str, Any] = {
    "block_out_channels": _UNET_8_8["block_out_channels"],
    "layers_per_block": _UNET_8_8["layers_per_block"],
    "in_channels": _UNET_8_8["in_channels"],
    "cross_attention_dim": _UNET_8_8["cross_attention_dim"],
    "conditioning_embedding_out_channels": (8, 8),
    "norm_num_groups": 1,
}
#: diffusers' AnimateDiff SDXL UNet (three blocks, text-time embedding of 6 × 8 + 32).
_UNET_SDXL = unet_config(
    (32, 64, 128),
    ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=(2, 4, 8),
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=8,
    transformer_layers_per_block=(1, 2, 4),
    projection_class_embeddings_input_dim=80,
    cross_attention_dim=64,
    norm_num_groups=1,
)
#: diffusers' text-to-video SD / I2VGenXL 3-D UNet (cross attention 4).
_UNET_3D = unet_config(
    (4, 8),
    ("CrossAttnDownBlock3D", "DownBlock3D"),
    ("UpBlock3D", "CrossAttnUpBlock3D"),
    layers_per_block=1,
    cross_attention_dim=4,
    attention_head_dim=4,
    norm_num_groups=2,
)
#: the schedulers of diffusers' tests: AnimateDiff's and PIA's; text-to-video SD's and I2VGenXL's
_DDIM_LINEAR: dict[str, Any] = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "linear",
    "clip_sample": False,
}
_DDIM_SCALED: dict[str, Any] = {**_DDIM_LINEAR, "beta_schedule": "scaled_linear", "set_alpha_to_one": False}


def tiny_autoencoder_kl(seed: int = 0) -> AutoencoderKL:
    """diffusers' AnimateDiff test VAE (4 latent channels, 2× in space), seeded, in eval mode."""
    return seeded(AutoencoderKL, _VAE_32_64, seed).eval()


def _animatediff_parts(unet: dict[str, Any], vae: dict[str, Any], **motion: Any) -> dict[str, Any]:
    """An AnimateDiff family's UNet, motion adapter of the same blocks, VAE and scheduler, seeded."""
    adapter = seeded(MotionAdapter, {"block_out_channels": unet["block_out_channels"], **_MOTION, **motion})
    return {
        "unet": seeded(UNet2DConditionModel, unet),
        "motion_adapter": adapter,
        "vae": seeded(AutoencoderKL, vae),
        "scheduler": DDIMScheduler(**_DDIM_LINEAR),
        "feature_extractor": None,
        "image_encoder": None,
    }


def _video_kwargs(embeddings: Prompt, guidance_scale: float, **fixed: Any) -> MakeKwargs:
    """:func:`tests.pipelines._shared.video_kwargs` of every builder here: 16×16, 4 frames at
    ``guidance_scale``, then ``fixed`` (``image=True``, ``finish``, the pipeline's own options)."""
    return video_kwargs(SIZE, guidance_scale, embeddings, num_frames=FRAMES, **fixed)


def _controlnet_frames(kwargs: dict[str, Any]) -> None:
    """A ControlNet call's conditioning: one seeded noise frame per video frame."""
    kwargs.setdefault("conditioning_frames", noise_frames(kwargs["num_frames"], SIZE, seed=3))


@builder(frames=_FRAMES, latents=_LATENTS_2X)
def animatediff() -> tuple[Pipeline, MakeKwargs]:
    """AnimateDiff text to video: SD's UNet with a motion adapter (a ``UNetMotionModel``), ``decode_latents``
    calling ``vae.decode`` on 3 frames, then 1. About 0.5 s a call on 2 CPU cores."""
    pipe = pipeline(AnimateDiffPipeline, **_animatediff_parts(_UNET_32_64, _VAE_32_64))
    return pipe, _video_kwargs(prompt_pair(32), 7.5, decode_chunk_size=DECODE_CHUNK)


@builder(frames=_FRAMES, latents=_LATENTS_2X)
def animatediff_pag() -> tuple[Pipeline, MakeKwargs]:
    """AnimateDiff with perturbed-attention guidance (``pag_scale`` 3 over classifier-free guidance): three
    branches a step; ``vae.decode`` on 3 frames, then 1."""
    pipe = pipeline(AnimateDiffPAGPipeline, **_animatediff_parts(_UNET_8_8, _VAE_8_8))
    return pipe, _video_kwargs(prompt_pair(8), 7.5, pag_scale=3.0, decode_chunk_size=DECODE_CHUNK)


@builder(frames=_FRAMES, latents=_LATENTS_2X)
def animatediff_controlnet() -> tuple[Pipeline, MakeKwargs]:
    """AnimateDiff with a ControlNet on one noise conditioning frame per frame; ``vae.decode`` on 3 frames,
    then 1."""
    parts = _animatediff_parts(_UNET_8_8, _VAE_8_8)
    controlnet = {**_CONTROLNET_8_8, "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D")}
    pipe = pipeline(AnimateDiffControlNetPipeline, controlnet=seeded(ControlNetModel, controlnet), **parts)
    return pipe, _video_kwargs(prompt_pair(8), 7.5, finish=_controlnet_frames, decode_chunk_size=DECODE_CHUNK)


@builder(frames=_FRAMES, latents=_LATENTS_2X)
def animatediff_sparse_controlnet() -> tuple[Pipeline, MakeKwargs]:
    """AnimateDiff with a SparseCtrl ControlNet conditioned on frames 0 and 2; ``vae.decode`` on all the
    frames at once."""
    parts = _animatediff_parts(_UNET_8_8, _VAE_8_8)
    controlnet = {
        **_CONTROLNET_8_8,
        "conditioning_channels": 3,
        "down_block_types": ("CrossAttnDownBlockMotion", "DownBlockMotion"),
        "use_simplified_condition_embedding": False,
    }
    pipe = pipeline(
        AnimateDiffSparseControlNetPipeline, controlnet=seeded(SparseControlNetModel, controlnet), **parts
    )

    def sparse_frames(kwargs: dict[str, Any]) -> None:
        kwargs.setdefault("conditioning_frames", noise_frames(2, SIZE, seed=3))
        kwargs.setdefault("controlnet_frame_indices", [0, 2])

    return pipe, _video_kwargs(prompt_pair(8), 7.5, finish=sparse_frames)


@builder(frames=_FRAMES, latents=_LATENTS_2X)
def animatediff_sdxl() -> tuple[Pipeline, MakeKwargs]:
    """AnimateDiff SDXL: SDXL's UNet (text-time embedding) with a motion adapter without a mid block;
    ``vae.decode`` on all the frames at once."""
    parts = _animatediff_parts(_UNET_SDXL, _VAE_32_64, use_motion_mid_block=False)
    pipe = pipeline(AnimateDiffSDXLPipeline, **parts)

    def embeddings() -> dict[str, Any]:
        return {
            **prompt_pair(64)(),
            "pooled_prompt_embeds": randn(1, 32, seed=4),
            "negative_pooled_prompt_embeds": randn(1, 32, seed=5),
        }

    return pipe, _video_kwargs(embeddings, 7.5)


@builder(frames=_FRAMES, latents=_LATENTS_2X)
def pia() -> tuple[Pipeline, MakeKwargs]:
    """PIA image to video: AnimateDiff's UNet and a motion adapter whose input takes the image's latent and
    mask (9 channels); ``vae.decode`` on all the frames at once."""
    pipe = pipeline(PIAPipeline, **_animatediff_parts(_UNET_32_64, _VAE_32_64, conv_in_channels=9))
    return pipe, _video_kwargs(prompt_pair(32), 7.5, image=True)


@builder(frames=_FRAMES, latents=_LATENTS_1X)
def text_to_video_sd() -> tuple[Pipeline, MakeKwargs]:
    """Text-to-video SD (ModelScope): a 3-D UNet; ``vae.decode`` on all the frames at once."""
    pipe = pipeline(
        TextToVideoSDPipeline,
        unet=seeded(UNet3DConditionModel, _UNET_3D),
        vae=seeded(AutoencoderKL, _VAE_8),
        scheduler=DDIMScheduler(**_DDIM_SCALED),
    )
    return pipe, _video_kwargs(prompt_pair(4), 6.0)


@builder(frames=_FRAMES, latents=_LATENTS_1X)
def i2vgen_xl() -> tuple[Pipeline, MakeKwargs]:
    """I2VGenXL image to video: its 3-D UNet, a CLIP image encoder on the image; ``vae.decode`` on 3 frames,
    then 1."""
    vision = CLIPVisionConfig(
        hidden_size=4,
        projection_dim=4,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        intermediate_size=16,
        patch_size=1,
    )
    pipe = pipeline(
        I2VGenXLPipeline,
        unet=seeded(I2VGenXLUNet, {**_UNET_3D, "num_attention_heads": None}),
        vae=seeded(AutoencoderKL, _VAE_8),
        scheduler=DDIMScheduler(**_DDIM_SCALED),
        image_encoder=seeded(CLIPVisionModelWithProjection, {"config": vision}),
        feature_extractor=CLIPImageProcessorPil(crop_size=32, size=32),
    )
    return pipe, _video_kwargs(prompt_pair(4), 6.0, image=True, decode_chunk_size=DECODE_CHUNK)
