"""The Sana-Video builders: text and image to video with the Wan 2.1 VAE ``tiny_wan21``, and SANA-WM's
camera-controlled image to video with the LTX-2 VAE ``tiny_ltx2_video``; one decode after the loop each."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    SanaImageToVideoPipeline,
    SanaVideoPipeline,
    SanaVideoTransformer3DModel,
    SanaWMPipeline,
    SanaWMTransformer3DModel,
)

from tests._vaes import tiny_ltx2_video, tiny_wan21
from tests.pipelines._shared import (
    MakeKwargs,
    Pipeline,
    Prompt,
    builder,
    call_kwargs,
    pipeline,
    prompt_pair,
    randn,
    seeded,
    video_kwargs,
)

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


#: ``negative_prompt`` defaults to "" in both calls, which they will not take with ``negative_prompt_embeds``;
#: resolution binning takes only the released 480p / 720p sample sizes.
_SANA_FIXED: dict[str, Any] = {"negative_prompt": None, "use_resolution_binning": False}


def _sana_prompt() -> Prompt:
    return prompt_pair(_SANA_TRANSFORMER["caption_channels"], mask_dtype=torch.long)


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
    return pipe, video_kwargs(32, 6.0, _sana_prompt(), finish=_frames_by_its_name, **_SANA_FIXED)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 16, 3, 4, 4))
def sana_video_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Sana-Video image-to-video, :func:`sana_video`'s transformer and VAE with a flow-matching Euler
    scheduler: a 32×32 image, whose latent (``vae.encode``) conditions the first latent frame, 32×32, 9
    frames → one ``vae.decode`` of [1, 16, 3, 4, 4] (de-normalized, the VAE's ``latents_mean`` and ``std``).
    Resolution binning off, as :func:`sana_video` (with it on, a size off the released ones is decoded at
    the nearest and resized back)."""
    pipe = pipeline(
        SanaImageToVideoPipeline,
        vae=tiny_wan21(),
        transformer=seeded(SanaVideoTransformer3DModel, _SANA_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    return pipe, video_kwargs(32, 6.0, _sana_prompt(), image=True, finish=_frames_by_its_name, **_SANA_FIXED)


#: A tiny SANA-WM transformer (the 1600M one's layout: linear-attention blocks with a softmax one every
#: ``softmax_every_n``, camera Plücker features after attention in every block), for ``tiny_ltx2_video``'s 8
#: latent channels and 8× temporal stride.
_SANA_WM_TRANSFORMER: dict[str, Any] = {
    "in_channels": 8,
    "num_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "linear_head_dim": 16,
    "softmax_every_n": 2,
    "chunk_plucker_post_attn_blocks": 2,
    "caption_channels": 16,  # the prompt embeddings' width
    "mlp_ratio": 2.0,
    "image_size": 32,
}


def _sana_wm_prompt() -> dict[str, Any]:
    """What SANA-WM's Gemma-2 step gives: prompt and negative embeddings ``[1, 1, 16, 16]`` (seeds 1, 2) with
    all-ones masks ``[1, 16]``; ``prompt`` itself is a required argument, unused once they are given."""
    ones = torch.ones(1, 16, dtype=torch.long)
    return {
        "prompt": "",
        "prompt_embeds": randn(1, 1, 16, 16, seed=1),
        "prompt_attention_mask": ones,
        "negative_prompt_embeds": randn(1, 1, 16, 16, seed=2),
        "negative_prompt_attention_mask": ones.clone(),
    }


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def sana_wm() -> tuple[Pipeline, MakeKwargs]:
    """SANA-WM camera-controlled image to video (``tiny_ltx2_video``, a tiny transformer, guidance 5.0): a
    32×32 first frame with intrinsics ``[32, 32, 16, 16]``, the action ``"w-8"`` (8 steps forward: a camera
    trajectory of 9 poses, which sets the frame count), 32×32. The first frame's latent is pinned clean, the
    rest denoised; then one ``vae.decode(latents, return_dict=False)`` of [1, 8, 2, 4, 4]. Its output has
    no batch axis: ``.frames`` [9, 32, 32, 3] (the call makes one video; the index lists it as
    [1, 9, 32, 32, 3]); ``output_type="latent"`` gives [1, 8, 2, 4, 4]."""
    pipe = pipeline(
        SanaWMPipeline,
        vae=tiny_ltx2_video(),
        transformer=seeded(SanaWMTransformer3DModel, _SANA_WM_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    camera = {"action": "w-8", "intrinsics": [32.0, 32.0, 16.0, 16.0]}
    fixed = {"height": 32, "width": 32, "num_frames": 9, "guidance_scale": 5.0, **camera}
    return pipe, call_kwargs(_sana_wm_prompt, image=32, **fixed)
