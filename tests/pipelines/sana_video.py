"""The Sana-Video builder: text to video with the Wan 2.1 VAE ``tiny_wan21``, one decode after the loop."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import DPMSolverMultistepScheduler, SanaVideoPipeline, SanaVideoTransformer3DModel

from tests._vaes import tiny_wan21
from tests.pipelines._shared import MakeKwargs, Pipeline, builder, pipeline, prompt_pair, seeded, video_kwargs

#: diffusers' tiny Sana-Video transformer (tests/pipelines/sana_video).
_SANA_TRANSFORMER: dict[str, Any] = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "num_layers": 2,
    "num_cross_attention_heads": 2,
    "cross_attention_head_dim": 12,
    "cross_attention_dim": 24,
    "caption_channels": 8,  # the prompt embeddings' width
    "mlp_ratio": 2.5,
    "dropout": 0.0,
    "attention_bias": False,
    "sample_size": 8,
    "patch_size": (1, 2, 2),
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32,
}


def _frames_by_its_name(kwargs: dict[str, Any]) -> None:
    kwargs.setdefault("frames", kwargs.pop("num_frames"))  # this call names its frame count ``frames``


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 16, 3, 4, 4))
def sana_video() -> tuple[Pipeline, MakeKwargs]:
    """Sana-Video text-to-video with the Wan 2.1 VAE ``tiny_wan21``: 32×32, 9 frames → one ``vae.decode`` of
    [1, 16, 3, 4, 4]. Resolution binning is off (it takes only the released 480p / 720p sample sizes); the
    call's frame count is ``frames``, which ``make_kwargs`` fills from ``num_frames``."""
    pipe = pipeline(
        SanaVideoPipeline,
        vae=tiny_wan21(),
        transformer=seeded(SanaVideoTransformer3DModel, _SANA_TRANSFORMER),
        scheduler=DPMSolverMultistepScheduler(),
    )
    prompt = prompt_pair(_SANA_TRANSFORMER["caption_channels"], mask_dtype=torch.long)
    # ``negative_prompt`` defaults to "" here, which the call will not take with ``negative_prompt_embeds``
    fixed: dict[str, Any] = {"negative_prompt": None, "use_resolution_binning": False}
    return pipe, video_kwargs(32, 6.0, prompt, finish=_frames_by_its_name, **fixed)
