"""EasyAnimate builders (text to video, inpainting; control, which diffusers 0.42.1 cannot run) with the
Magvit VAE ``tiny_magvit``: one decode after the loop."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    EasyAnimateControlPipeline,
    EasyAnimateInpaintPipeline,
    EasyAnimatePipeline,
    EasyAnimateTransformer3DModel,
    FlowMatchEulerDiscreteScheduler,
)
from diffusers.pipelines.easyanimate.pipeline_easyanimate_inpaint import get_image_to_video_latent

from tests._vaes import tiny_magvit
from tests.pipelines._shared import (
    MakeKwargs,
    Pipeline,
    builder,
    noise_image,
    pipeline,
    prompt_pair,
    randn,
    seeded,
    video_kwargs,
)

#: diffusers' tests/pipelines/easyanimate transformer, less its attention heads.
_EASYANIMATE_TRANSFORMER: dict[str, Any] = {
    "in_channels": 4,
    "out_channels": 4,
    "time_embed_dim": 2,
    "text_embed_dim": 16,
    "num_layers": 1,
    "sample_width": 16,
    "sample_height": 16,
    "patch_size": 2,
}
#: 2 heads of 16, not the test's 4 of 8: the rotary embedding splits a head 4 / 6 / 6 over time, height and
#: width, and 4 heads of 8 give an odd split, which diffusers 0.42.1 rejects.
_EASYANIMATE_HEADS: dict[str, Any] = {"num_attention_heads": 2, "attention_head_dim": 16}


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def easyanimate() -> tuple[Pipeline, MakeKwargs]:
    """EasyAnimate text to video (``tiny_magvit``: 4 channels, 4× in time, 8× in space; diffusers' test
    transformer): 16×16, 9 frames → one ``vae.decode(latents / scaling_factor, return_dict=False)`` of
    [1, 4, 3, 2, 2] → 9 frames. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = pipeline(
        EasyAnimatePipeline,
        vae=tiny_magvit(),
        transformer=seeded(EasyAnimateTransformer3DModel, {**_EASYANIMATE_TRANSFORMER, **_EASYANIMATE_HEADS}),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    return pipe, video_kwargs(16, 6.0, prompt_pair(16, mask_dtype=torch.long))


def _easyanimate(pipeline_class: type[Any], **transformer: Any) -> Pipeline:
    """A tiny EasyAnimate pipeline of ``pipeline_class``; ``transformer`` adds to its transformer's config."""
    config = {**_EASYANIMATE_TRANSFORMER, **_EASYANIMATE_HEADS, **transformer}
    return pipeline(
        pipeline_class,
        vae=tiny_magvit(),
        transformer=seeded(EasyAnimateTransformer3DModel, config),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )


def _first_frame_inputs(kwargs: dict[str, Any]) -> None:
    """EasyAnimate's own image-to-video inputs (``get_image_to_video_latent``): a 16×16 noise image held
    over ``num_frames`` frames in [0, 1] as ``video``, and ``mask_video`` 0 on the first frame (kept), 255
    on the others (generated)."""
    if "video" not in kwargs:
        size = (kwargs["height"], kwargs["width"])
        video, mask = get_image_to_video_latent(noise_image(16), None, kwargs["num_frames"], size)
        kwargs["video"], kwargs["mask_video"] = video, mask


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def easyanimate_inpaint() -> tuple[Pipeline, MakeKwargs]:
    """EasyAnimate inpainting, image to video (``tiny_magvit``; diffusers' test transformer taking the
    noise, the mask latents and the masked video's latents, 4 + 4 + 4 channels): 16×16, 9 frames, the first
    frame a noise image, the rest to generate. ``vae.encode`` of the tiled mask and of the masked video
    (noise-augmented from the call's generator), then one ``vae.decode(latents / scaling_factor,
    return_dict=False)`` of [1, 4, 3, 2, 2] → 9 frames. About 0.1 s a call on 2 CPU cores; no audio.

    ``resize_inpaint_mask_directly`` is off: with it on (the default), a mask that is not all 255 reads
    ``vae.config.cache_mag_vae``, which ``AutoencoderKLMagvit``'s config does not have in diffusers 0.42.1.
    """
    pipe = _easyanimate(EasyAnimateInpaintPipeline, in_channels=12, resize_inpaint_mask_directly=False)
    return pipe, video_kwargs(16, 6.0, prompt_pair(16, mask_dtype=torch.long), finish=_first_frame_inputs)


def _control_video(kwargs: dict[str, Any]) -> None:
    """A seeded control video ``[1, 3, num_frames, 16, 16]`` in [0, 1]."""
    noise = randn(1, 3, kwargs["num_frames"], 16, 16, seed=3)
    kwargs.setdefault("control_video", (noise / 4 + 0.5).clamp(0, 1))


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def easyanimate_control() -> tuple[Pipeline, MakeKwargs]:
    """EasyAnimate control (``tiny_magvit``; diffusers' test transformer taking the noise, the control
    video's latents and the reference image's, 4 + 4 + 4 channels): 16×16, a 9-frame control video in
    [0, 1]. streamvae refuses it: in diffusers 0.42.1 its ``__call__`` passes ``encode_prompt`` a
    ``text_encoder_index`` it does not take (a TypeError before the first step) and, after its loop, calls a
    ``decode_latents`` the class does not define; only ``output_type="latent"`` could get past the second.
    The shapes are those the call would give."""
    pipe = _easyanimate(EasyAnimateControlPipeline, in_channels=12)
    return pipe, video_kwargs(16, 6.0, prompt_pair(16, mask_dtype=torch.long), finish=_control_video)
