"""HunyuanVideo builders: text to video, image to video (HunyuanVideo-I2V, SkyReels-V1), Framepack, and
HunyuanVideo 1.5 text and image to video.

Most decode once after the loop and keep every frame; HunyuanVideo-I2V "latent_concat" drops the first 4
decoded frames, Framepack decodes once per section and blends each section's pixels into the ones before
it, and HunyuanVideo 1.5 takes no ``callback_on_step_end``. :data:`HUNYUAN15_TRANSFORMER`,
:func:`hunyuan15_components` and :func:`hunyuan15_prompt` also serve the modular HunyuanVideo 1.5 builder.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLHunyuanVideo,
    ClassifierFreeGuidance,
    FlowMatchEulerDiscreteScheduler,
    HunyuanSkyreelsImageToVideoPipeline,
    HunyuanVideo15ImageToVideoPipeline,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
    HunyuanVideoFramepackPipeline,
    HunyuanVideoFramepackTransformer3DModel,
    HunyuanVideoImageToVideoPipeline,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
)
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_framepack import FramepackSamplingType
from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

from tests._vaes import tiny_hunyuan_video, tiny_hunyuan_video15
from tests.pipelines._shared import (
    TEXT_TOKENS,
    MakeKwargs,
    Pipeline,
    Prompt,
    builder,
    call_kwargs,
    noise_frames,
    pipeline,
    randn,
    seeded,
    video_kwargs,
)

# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo text to video
# ---------------------------------------------------------------------------------------------------------

_HUNYUAN_TRANSFORMER: dict[str, Any] = {
    "in_channels": 4,
    "out_channels": 4,
    "num_attention_heads": 2,
    "attention_head_dim": 10,
    "num_layers": 1,
    "num_single_layers": 1,
    "num_refiner_layers": 1,
    "patch_size": 1,
    "patch_size_t": 1,
    "guidance_embeds": True,
    "text_embed_dim": 16,
    "pooled_projection_dim": 8,
    "rope_axes_dim": (2, 4, 4),
}
_HUNYUAN_VAE: dict[str, Any] = {
    "latent_channels": 4,
    "down_block_types": ("HunyuanVideoDownBlock3D",) * 4,
    "up_block_types": ("HunyuanVideoUpBlock3D",) * 4,
    "block_out_channels": (8, 8, 8, 8),
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "scaling_factor": 0.476986,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 4,
    "mid_block_add_attention": True,
}


def _hunyuan_prompt(*, negative: bool) -> Prompt:
    """HunyuanVideo's prompt embeddings (LLaMA [1, 16, 16], pooled CLIP [1, 8], an all-ones mask) for the
    prompt (seeds 1, 2) and, if ``negative``, the negative prompt (seeds 3, 4)."""
    prompts = (("", 1), ("negative_", 3)) if negative else (("", 1),)

    def prompt() -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for prefix, seed in prompts:
            kwargs[f"{prefix}prompt_embeds"] = randn(1, TEXT_TOKENS, 16, seed=seed)
            kwargs[f"{prefix}pooled_prompt_embeds"] = randn(1, 8, seed=seed + 1)
            kwargs[f"{prefix}prompt_attention_mask"] = torch.ones(1, TEXT_TOKENS)
        return kwargs

    return prompt


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2), core=True)
def hunyuan_video() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo text-to-video (guidance-distilled): 16×16, 9 frames → latents [1, 4, 3, 2, 2]."""
    pipe = pipeline(
        HunyuanVideoPipeline,
        transformer=seeded(HunyuanVideoTransformer3DModel, _HUNYUAN_TRANSFORMER),
        vae=seeded(AutoencoderKLHunyuanVideo, _HUNYUAN_VAE),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    return pipe, video_kwargs(16, 4.5, _hunyuan_prompt(negative=False))


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo image to video (HunyuanVideo-I2V, SkyReels-V1)
# ---------------------------------------------------------------------------------------------------------


def _hunyuan_i2v(pipeline_class: Any, **transformer: Any) -> Pipeline:
    return pipeline(
        pipeline_class,
        transformer=seeded(HunyuanVideoTransformer3DModel, {**_HUNYUAN_TRANSFORMER, **transformer}),
        vae=tiny_hunyuan_video(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        **({"image_processor": None} if pipeline_class is HunyuanVideoImageToVideoPipeline else {}),
    )


@builder(frames=(1, 5, 16, 16, 3), latents=(1, 4, 2, 2, 2))
def hunyuan_video_i2v() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo-I2V, ``image_condition_type`` "latent_concat" (diffusers' test config: 9 input channels
    = noise, the image latent repeated with later frames zeroed, a mask; no guidance embedding;
    ``tiny_hunyuan_video``): a 16×16 image, ``num_frames`` 9 → ``vae.encode`` of the image, one
    ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames, of which the pipeline drops the first 4 (the image's
    latent's frames): ``.frames`` [1, 5, 16, 16, 3]. The ``"latent"`` output drops the first latent too:
    [1, 4, 2, 2, 2]. Its plan drops those 4 frames from the front of the stream (``drop_frames``). About
    0.05 s a call on 2 CPU cores; no audio."""
    pipe = _hunyuan_i2v(
        HunyuanVideoImageToVideoPipeline,
        in_channels=2 * 4 + 1,
        guidance_embeds=False,
        image_condition_type="latent_concat",
    )
    return pipe, video_kwargs(16, 1.0, _hunyuan_prompt(negative=True), image=True)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def hunyuan_video_i2v_token_replace() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo-I2V, ``image_condition_type`` "token_replace" (the image's latent replaces the first
    latent frame at every step; 4 input channels, distilled guidance 4.5; ``tiny_hunyuan_video``): a 16×16
    image, 9 frames → one ``vae.decode`` of [1, 4, 3, 2, 2], every frame kept: ``.frames``
    [1, 9, 16, 16, 3]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _hunyuan_i2v(HunyuanVideoImageToVideoPipeline, image_condition_type="token_replace")
    return pipe, video_kwargs(16, 4.5, _hunyuan_prompt(negative=True), image=True)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def hunyuan_skyreels_i2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V1 (HunyuanVideo) image to video (diffusers' test config: 8 input channels = noise and the
    image latent padded with zeros; distilled guidance embedding, true classifier-free guidance 6.0 from
    the negative embeddings; ``tiny_hunyuan_video``): a 16×16 image, 9 frames → ``vae.encode`` of the
    image, one ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _hunyuan_i2v(HunyuanSkyreelsImageToVideoPipeline, in_channels=8)
    return pipe, video_kwargs(16, 4.5, _hunyuan_prompt(negative=True), image=True)


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo Framepack: one decode per section, blended
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/hunyuan_video framepack transformer: HunyuanVideo's, 2×2 patches, with the
#: image projection and the clean-latent embedder.
_FRAMEPACK_TRANSFORMER: dict[str, Any] = {
    **_HUNYUAN_TRANSFORMER,
    "patch_size": 2,
    "image_condition_type": None,
    "has_image_proj": True,
    "image_proj_dim": 32,
    "has_clean_x_embedder": True,
}
#: A tiny SigLIP vision tower (hidden size = the transformer's image_proj_dim) in place of diffusers'
#: hf-internal-testing download.
_SIGLIP_VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 30,
    "patch_size": 2,
}


def _siglip_image_encoder() -> dict[str, Any]:
    """The ``image_encoder`` (the :data:`_SIGLIP_VISION` tower, seeded) and its 30×30 feature extractor."""
    return {
        "image_encoder": seeded(SiglipVisionModel, {"config": SiglipVisionConfig(**_SIGLIP_VISION)}),
        "feature_extractor": SiglipImageProcessorPil(size={"height": 30, "width": 30}),
    }


def _framepack(sampling_type: FramepackSamplingType) -> tuple[Pipeline, MakeKwargs]:
    pipe = pipeline(
        HunyuanVideoFramepackPipeline,
        transformer=seeded(HunyuanVideoFramepackTransformer3DModel, _FRAMEPACK_TRANSFORMER),
        vae=tiny_hunyuan_video(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        **_siglip_image_encoder(),
    )
    fixed: dict[str, Any] = {"num_frames": 18, "latent_window_size": 3, "sampling_type": sampling_type}
    return pipe, video_kwargs(32, 4.5, _hunyuan_prompt(negative=False), image=True, **fixed)


# Framepack's latent output is a list, the history after each section: ``latents`` is the last one's.
@builder(frames=(1, 25, 32, 32, 3), latents=(1, 4, 7, 4, 4))
def framepack() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo Framepack image to video, inverted anti-drifting sampling (the default: sections from
    the end back to the image; ``tiny_hunyuan_video``, a tiny SigLIP image encoder, distilled guidance 4.5):
    32×32, ``num_frames`` 18 in windows of 3 latents → 2 sections, ``.frames`` [1, 25, 32, 32, 3].

    ``vae.encode`` once (the image, [1, 3, 1, 32, 32]), then one ``vae.decode(…, return_dict=False)`` per
    section: [1, 4, 3, 4, 4] (the last section's latents → 9 frames), then [1, 4, 7, 4, 4] (the image
    latent, this section, the one before → 25 frames), blended in front of the frames so far over
    ``(window − 1) · 4 + 1`` = 9 frames. ``output_type="latent"`` gives a list, the history after each
    section: [1, 4, 3, 4, 4], [1, 4, 7, 4, 4].
    """
    return _framepack(FramepackSamplingType.INVERTED_ANTI_DRIFTING)


@builder(frames=(1, 25, 32, 32, 3), latents=(1, 4, 7, 4, 4))
def framepack_vanilla() -> tuple[Pipeline, MakeKwargs]:
    """:func:`framepack` with vanilla sampling (sections from the image forward): the same
    ``.frames`` [1, 25, 32, 32, 3]; decodes [1, 4, 4, 4, 4] (image latent and the first section → 13
    frames), then the last [1, 4, 6, 4, 4] (→ 21 frames), blended after the frames so far over 9 frames.
    ``output_type="latent"``: [1, 4, 4, 4, 4], [1, 4, 7, 4, 4]."""
    return _framepack(FramepackSamplingType.VANILLA)


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo 1.5 (no callback_on_step_end): text and image to video
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/hunyuan_video1_5 transformer: latents, condition latents and mask in.
HUNYUAN15_TRANSFORMER: dict[str, Any] = {
    "in_channels": 4 + 4 + 1,
    "out_channels": 4,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "num_layers": 1,
    "num_refiner_layers": 1,
    "mlp_ratio": 2.0,
    "patch_size": 1,
    "patch_size_t": 1,
    "text_embed_dim": 16,
    "text_embed_2_dim": 32,
    "image_embed_dim": 12,
    "rope_axes_dim": (2, 2, 4),
    "target_size": 16,
    "task_type": "t2v",
}


def hunyuan15_components(transformer: dict[str, Any] = HUNYUAN15_TRANSFORMER) -> dict[str, Any]:
    """The models of a HunyuanVideo 1.5 pipeline: the tiny ``transformer`` (seeded),
    ``tiny_hunyuan_video15`` (4 channels, 4× in time, 8× in space), the flow-matching scheduler (shift 7)
    and classifier-free guidance 6.0 from its guider."""
    return {
        "transformer": seeded(HunyuanVideo15Transformer3DModel, transformer),
        "vae": tiny_hunyuan_video15(),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),
        "guider": ClassifierFreeGuidance(guidance_scale=6.0),
    }


def hunyuan15_prompt() -> dict[str, Any]:
    """Both text encoders' embeddings (Qwen2.5-VL's [1, 16, 16], ByT5's [1, 16, 32]) with all-ones masks,
    for the prompt and the negative prompt."""
    kwargs: dict[str, Any] = {}
    for prefix, seed in (("", 1), ("negative_", 3)):
        kwargs[f"{prefix}prompt_embeds"] = randn(1, TEXT_TOKENS, 16, seed=seed)
        kwargs[f"{prefix}prompt_embeds_mask"] = torch.ones(1, TEXT_TOKENS)
        kwargs[f"{prefix}prompt_embeds_2"] = randn(1, TEXT_TOKENS, 32, seed=seed + 1)
        kwargs[f"{prefix}prompt_embeds_mask_2"] = torch.ones(1, TEXT_TOKENS)
    return kwargs


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def hunyuan_video15() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo 1.5 text to video (``tiny_hunyuan_video15``: 4 channels, 4× in time, 8× in space;
    classifier-free guidance 6.0 from its guider, the call has no ``guidance_scale``): 16×16, 9 frames →
    ``.frames`` [1, 9, 16, 16, 3]. One ``vae.decode(latents / scaling_factor, return_dict=False)`` of
    [1, 4, 3, 2, 2]; ``output_type="latent"`` gives [1, 4, 3, 2, 2]. The image embeddings of t2v are the
    pipeline's own zeros (no image encoder)."""
    pipe = pipeline(HunyuanVideo15Pipeline, **hunyuan15_components())
    return pipe, call_kwargs(hunyuan15_prompt, height=16, width=16, num_frames=9)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def hunyuan_video15_i2v() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo 1.5 image to video (``tiny_hunyuan_video15``, a tiny SigLIP image encoder, guidance 6.0
    from its guider; the call has no ``height`` / ``width`` / ``guidance_scale``): the size is the image's,
    fitted to the transformer's ``target_size`` 16 → 16×16; 9 frames → ``vae.encode`` of the image, one
    ``vae.decode(latents / scaling_factor, return_dict=False)`` of [1, 4, 3, 2, 2] → ``.frames``
    [1, 9, 16, 16, 3]. About 0.1 s a call on 2 CPU cores; no audio."""
    transformer = {
        **HUNYUAN15_TRANSFORMER,
        "image_embed_dim": _SIGLIP_VISION["hidden_size"],
        "task_type": "i2v",
    }
    components = hunyuan15_components(transformer)
    pipe = pipeline(HunyuanVideo15ImageToVideoPipeline, **components, **_siglip_image_encoder())

    def image(kwargs: dict[str, Any]) -> None:
        kwargs.setdefault("image", noise_frames(1, 16, seed=3)[0])

    return pipe, call_kwargs(hunyuan15_prompt, finish=image, num_frames=9)
