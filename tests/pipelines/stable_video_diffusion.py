"""The Stable Video Diffusion builder: image to video with a 2D VAE and a temporal decoder
(``tiny_stable_video``), which decodes the frames flattened into a batch (``[B·F, C, h, w]``,
``num_frames=``) in calls of ``decode_chunk_size`` frames; its ``fps`` is the call's own (``pipeline_fps``
through generate_mp4)."""

from __future__ import annotations

from typing import Any

from diffusers import EulerDiscreteScheduler, StableVideoDiffusionPipeline, UNetSpatioTemporalConditionModel
from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModelWithProjection

from tests._vaes import tiny_stable_video
from tests.pipelines._shared import MakeKwargs, Pipeline, builder, call_kwargs, pipeline, seeded, unet_config

#: diffusers' tests/pipelines/stable_video_diffusion UNet (latents and the image latent in, 4 + 4).
_SVD_UNET = unet_config(
    (32, 64),
    ("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
    ("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
    in_channels=8,
    cross_attention_dim=32,
    num_attention_heads=8,
    projection_class_embeddings_input_dim=96,
    addition_time_embed_dim=32,
)
#: diffusers' test scheduler (SVD's released one: v-prediction, Karras sigmas).
_SVD_SCHEDULER: dict[str, Any] = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "sigma_max": 700.0,
    "sigma_min": 0.002,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "timestep_type": "continuous",
    "trained_betas": None,
    "use_karras_sigmas": True,
}
#: diffusers' test CLIP vision tower, at the 224×224 the pipeline resizes a PIL image to before the image
#: encoder (diffusers' test passes a tensor, which it does not resize), in 32-pixel patches (7×7 tokens).
_SVD_CLIP_VISION: dict[str, Any] = {
    "hidden_size": 32,
    "projection_dim": 32,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "image_size": 224,
    "intermediate_size": 37,
    "patch_size": 32,
}


@builder(frames=(1, 4, 16, 16, 3), latents=(1, 4, 4, 8, 8))  # latents frames first
def stable_video_diffusion() -> tuple[Pipeline, MakeKwargs]:
    """Stable Video Diffusion image to video (``tiny_stable_video``: 4 channels, 2× in space, one frame per
    latent; diffusers' test UNet, CLIP image encoder and scheduler; guidance from 1.0 to 2.5 over the
    frames): a 16×16 image, ``num_frames`` 4 → ``vae.encode`` of the noised image, one
    ``vae.decode(latents / scaling_factor, num_frames=4)`` of [4, 4, 8, 8] (the frames are the batch:
    ``decode_chunk_size`` defaults to ``num_frames``) → ``.frames`` [1, 4, 16, 16, 3]. The ``"latent"``
    output is frames first, [1, 4, 4, 8, 8]. A ``decode_chunk_size`` below ``num_frames`` decodes in
    several calls (the temporal decoder then sees each call's frames alone; with several videos one call
    may hold the end of one and the start of the next): streamvae stands in for each call
    (``FrameBatches``). About 0.35 s a call on 2 CPU cores; no audio."""
    pipe = pipeline(
        StableVideoDiffusionPipeline,
        vae=tiny_stable_video(),
        unet=seeded(UNetSpatioTemporalConditionModel, _SVD_UNET),
        scheduler=EulerDiscreteScheduler(**_SVD_SCHEDULER),
        image_encoder=seeded(CLIPVisionModelWithProjection, {"config": CLIPVisionConfig(**_SVD_CLIP_VISION)}),
        feature_extractor=CLIPImageProcessorPil(crop_size=224, size=224),
    )
    guidance: dict[str, Any] = {"min_guidance_scale": 1.0, "max_guidance_scale": 2.5}
    # no prompt: the image is the whole condition
    return pipe, call_kwargs(lambda: {}, image=16, height=16, width=16, num_frames=4, **guidance)
