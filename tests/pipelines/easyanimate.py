"""The EasyAnimate builder: text to video with the Magvit VAE ``tiny_magvit``, one decode after the loop."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import EasyAnimatePipeline, EasyAnimateTransformer3DModel, FlowMatchEulerDiscreteScheduler

from tests._vaes import tiny_magvit
from tests.pipelines._shared import MakeKwargs, Pipeline, builder, pipeline, prompt_pair, seeded, video_kwargs

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
