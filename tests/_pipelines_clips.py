"""Tiny seeded diffusers pipelines that decode clip by clip or loop over long videos, and more Wan-VAE users.

The same contract as :mod:`tests._pipelines` (whose helpers this module reuses): each builder in
:data:`BUILDERS` returns ``(pipe, make_kwargs)``, ``pipe(**make_kwargs(), output_type="np")`` runs 2 inference
steps on a few tiny frames from prompt embeddings (no text encoder, no tokenizer) with a fresh
``torch.Generator().manual_seed(0)`` every call, and ``make_kwargs(**overrides)`` replaces or adds keys. A
pipeline is built once per process (``functools.cache``): do not mutate the cached pipe or its components.

What sets these pipelines apart is how they reach the VAE:

* ``helios`` / ``helios_pyramid`` denoise autoregressive chunks of 9 latent frames and call ``vae.decode``
  once per chunk, inside the chunk loop (so also with ``output_type="latent"``); the decoded chunks are
  concatenated and trimmed to ``1 + 4k`` frames.
* ``wan_animate`` generates segments, decodes each one at once and re-encodes the last decoded pixel frame(s)
  as the next segment's condition; its ``"latent"`` output is the last segment's latents only.
* ``skyreels_v2_df_long`` runs several diffusion-forcing iterations on overlapping latent windows but
  decodes the accumulated latents once at the end; ``skyreels_v2_df`` is the one-iteration short mode.
* ``sana_video`` and ``kandinsky5_t2v`` decode once; Kandinsky 5 keeps its latents channels-last.

:data:`EXPECTED` gives, for the default kwargs, the shape of ``.frames`` with ``output_type="np"``
(``[batch, frames, height, width, 3]``) and with ``output_type="latent"`` (each pipeline's own layout).
No pipeline here returns audio.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import (
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeliosPipeline,
    HeliosPyramidPipeline,
    HeliosScheduler,
    HeliosTransformer3DModel,
    Kandinsky5T2VPipeline,
    Kandinsky5Transformer3DModel,
    SanaVideoPipeline,
    SanaVideoTransformer3DModel,
    SkyReelsV2DiffusionForcingPipeline,
    SkyReelsV2Transformer3DModel,
    UniPCMultistepScheduler,
    WanAnimatePipeline,
    WanAnimateTransformer3DModel,
)
from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModelWithProjection

from tests._pipelines import (
    _CLIP_VISION,
    _TEXT_TOKENS,
    _WAN_TRANSFORMER,
    Builder,
    Expected,
    MakeKwargs,
    Pipeline,
    _pipeline,
    _prompt_pair,
    _randn,
    _seeded,
    _video_kwargs,
)
from tests._vaes import tiny_hunyuan_video, tiny_wan21

__all__ = ["BUILDERS", "EXPECTED"]

_WAN_TEXT_DIM = 32  # the text_dim of every Wan-style transformer below (diffusers' tests)

# ---------------------------------------------------------------------------------------------------------
# Helios (HeliosPipeline, HeliosPyramidPipeline): autoregressive chunks, one decode per chunk
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tiny Helios transformer (tests/pipelines/helios).
_HELIOS_TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": _WAN_TEXT_DIM,
    "freq_dim": 256,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_dim": (4, 4, 4),
    "has_multi_term_memory_patch": True,
    "guidance_cross_attn": True,
    "zero_history_timestep": True,
    "is_amplify_history": False,
}
#: 2 chunks: each chunk is ``num_latent_frames_per_chunk`` 9 latents = a 33-frame window, and the call runs
#: ``ceil(num_frames / 33)`` chunks (67–99 frames give 3).
_HELIOS_FRAMES = 66


def _helios(pipeline_class: type[Any], scheduler: HeliosScheduler) -> Pipeline:
    return _pipeline(
        pipeline_class,
        vae=tiny_wan21(),  # diffusers' Helios test VAE is this layout (base_dim 3, z_dim 16)
        transformer=_seeded(HeliosTransformer3DModel, _HELIOS_TRANSFORMER),
        scheduler=scheduler,
    )


@functools.cache
def helios() -> tuple[Pipeline, MakeKwargs]:
    """Helios text-to-video (diffusers' own test config, Wan 2.1 VAE ``tiny_wan21``): 16×16, ``num_frames``
    66 → 2 autoregressive chunks of 9 latent frames, each decoded alone (``vae.decode`` of [1, 16, 9, 2, 2],
    33 frames, twice); the 66 decoded frames are cut to 65. ``num_frames`` 67 to 99 gives 3 chunks and 97
    frames (the call makes whole chunks and never cuts to ``num_frames``). The ``"latent"`` output is every
    chunk's latents: [1, 16, 18, 2, 2].
    """
    scheduler = HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True)
    pipe = _helios(HeliosPipeline, scheduler)
    return pipe, _video_kwargs(16, 5.0, _prompt_pair(_WAN_TEXT_DIM), num_frames=_HELIOS_FRAMES)


@functools.cache
def helios_pyramid() -> tuple[Pipeline, MakeKwargs]:
    """Helios pyramid text-to-video: 2 pyramid stages of 1 step each (latents 2×2, then 4×4), 32×32,
    ``num_frames`` 66 → 2 chunks, each decoded alone (``vae.decode`` of [1, 16, 9, 4, 4], twice) → 65 frames;
    ``"latent"`` output [1, 16, 18, 4, 4].

    The call has no ``num_inference_steps`` (``make_kwargs`` drops it; override
    ``pyramid_num_inference_steps_list`` instead). The scheduler's ``gamma`` is 0.3, not the default 1/3:
    the block noise added when a stage upsamples has the covariance ``(1+γ)I − γJ`` over 2×2 patches,
    singular at γ = 1/3 (eigenvalue 1 − 3γ), and CPU LAPACK's Cholesky rejects it in float32.
    """
    scheduler = HeliosScheduler(stage_range=[0, 0.5, 1], stages=2, gamma=0.3, use_dynamic_shifting=True)
    pipe = _helios(HeliosPyramidPipeline, scheduler)
    prompt = _prompt_pair(_WAN_TEXT_DIM)
    base = _video_kwargs(32, 5.0, prompt, num_frames=_HELIOS_FRAMES, pyramid_num_inference_steps_list=[1, 1])

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        del kwargs["num_inference_steps"]
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# Wan-Animate: segments, one decode per segment, the next conditioned on the last decoded frame
# ---------------------------------------------------------------------------------------------------------

_ANIMATE_SIZE = 16
#: diffusers' tiny Wan-Animate transformer (tests/pipelines/wan/test_wan_animate.py), with the CLIP vision
#: tower of tests._pipelines (hidden size 4).
_ANIMATE_TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 36,  # noise 16 + mask 4 + condition 16
    "latent_channels": 16,
    "out_channels": 16,
    "text_dim": _WAN_TEXT_DIM,
    "freq_dim": 256,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "image_dim": _CLIP_VISION["hidden_size"],
    "rope_max_seq_len": 32,
    "motion_encoder_channel_sizes": {"4": 16, "8": 16, "16": 16},
    "motion_encoder_size": _ANIMATE_SIZE,  # the face video's frame size
    "motion_style_dim": 8,
    "motion_dim": 4,
    "motion_encoder_dim": 16,
    "face_encoder_hidden_dim": 16,
    "face_encoder_num_heads": 2,
    "inject_face_latents_blocks": 2,
}


def _frames(count: int, size: int, seed: int) -> list[PIL.Image.Image]:
    """``count`` seeded RGB noise frames ``size`` × ``size`` (new objects every call)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    return [PIL.Image.fromarray(frame) for frame in pixels]


@functools.cache
def wan_animate() -> tuple[Pipeline, MakeKwargs]:
    """Wan-Animate, animation mode (tiny CLIP image encoder: the pipeline takes no ``image_embeds`` with
    its required ``image``): 16×16, a 17-frame pose / face video, ``segment_frame_length`` 9 and
    ``prev_segment_conditioning_frames`` 1 (the default) → 2 segments of 8 new frames each.

    Each segment denoises [1, 16, 1 + 3, 2, 2] (its first latent frame is the reference image's slot) and
    decodes [1, 16, 3, 2, 2] → 9 frames; the second segment is conditioned on the first's last decoded
    frame (re-encoded) and drops its own first decoded frame: 9 + 8 = 17 frames. The ``"latent"`` output is
    only the last segment's latents, de-normalized to the VAE's scale and with the reference slot:
    [1, 16, 4, 2, 2].

    ``num_frames`` sets the pose / face video length (not a pipeline argument): 25 gives 3 segments; a
    length that is not ``1 + 8k`` is padded to the next one and the video cut back to it. With
    ``prev_segment_conditioning_frames=5`` the segments must be longer (``segment_frame_length=13``): a
    segment's kept frames must hold the next one's 5 conditioning frames.
    """
    image_encoder = _seeded(CLIPVisionModelWithProjection, {"config": CLIPVisionConfig(**_CLIP_VISION)})
    pipe = _pipeline(
        WanAnimatePipeline,
        vae=tiny_wan21(),
        transformer=_seeded(WanAnimateTransformer3DModel, _ANIMATE_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        image_encoder=image_encoder,
        image_processor=CLIPImageProcessorPil(crop_size=16, size=16),
    )
    prompt = _prompt_pair(_WAN_TEXT_DIM)
    base = _video_kwargs(
        _ANIMATE_SIZE, 6.0, prompt, image=True, num_frames=17, segment_frame_length=9, mode="animate"
    )

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        frames = kwargs.pop("num_frames")
        kwargs.setdefault("pose_video", _frames(frames, _ANIMATE_SIZE, seed=3))
        kwargs.setdefault("face_video", _frames(frames, _ANIMATE_SIZE, seed=4))
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# SkyReels-V2 diffusion forcing: short mode, and long mode (overlapping iterations, one decode)
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tiny SkyReels-V2 transformer (tests/pipelines/skyreels_v2): the tiny Wan one, 16 channels.
_SKYREELS_TRANSFORMER: dict[str, Any] = {**_WAN_TRANSFORMER, "in_channels": 16, "out_channels": 16}


@functools.cache
def _skyreels_v2_df_pipe() -> Pipeline:
    return _pipeline(
        SkyReelsV2DiffusionForcingPipeline,
        vae=tiny_wan21(),
        transformer=_seeded(SkyReelsV2Transformer3DModel, _SKYREELS_TRANSFORMER),
        # diffusers' tests' scheduler, with the flow prediction of the released checkpoints
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0
        ),
    )


def _skyreels_kwargs(**fixed: Any) -> MakeKwargs:
    base = _video_kwargs(16, 6.0, _prompt_pair(_WAN_TEXT_DIM), **fixed)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        return {"prompt": None, **base(**overrides)}  # ``prompt`` has no default in this __call__

    return make_kwargs


@functools.cache
def skyreels_v2_df() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing, short mode (``num_frames`` ≤ ``base_num_frames``, synchronous): 16×16,
    9 frames → one iteration, one ``vae.decode`` of [1, 16, 3, 2, 2]."""
    return _skyreels_v2_df_pipe(), _skyreels_kwargs(base_num_frames=9)


@functools.cache
def skyreels_v2_df_long() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing, long mode: 16×16, ``num_frames`` 17 (5 latents), ``base_num_frames`` 9
    (windows of 3 latents), ``overlap_history`` 5 (2 latents kept) → 3 iterations (3 + 1 + 1 new latents);
    the accumulated latents are decoded once at the end, ``vae.decode`` of [1, 16, 5, 2, 2] → 17 frames.
    ``num_frames=13`` gives 2 iterations.
    """
    return _skyreels_v2_df_pipe(), _skyreels_kwargs(num_frames=17, base_num_frames=9, overlap_history=5)


# ---------------------------------------------------------------------------------------------------------
# Sana-Video (Wan 2.1 VAE)
# ---------------------------------------------------------------------------------------------------------

_SANA_TEXT_DIM = 8
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
    "caption_channels": _SANA_TEXT_DIM,
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


@functools.cache
def sana_video() -> tuple[Pipeline, MakeKwargs]:
    """Sana-Video text-to-video with the Wan 2.1 VAE ``tiny_wan21``: 32×32, 9 frames → one ``vae.decode`` of
    [1, 16, 3, 4, 4]. Resolution binning is off (it takes only the released 480p / 720p sample sizes); the
    call's frame count is ``frames``, which ``make_kwargs`` fills from ``num_frames``."""
    pipe = _pipeline(
        SanaVideoPipeline,
        vae=tiny_wan21(),
        transformer=_seeded(SanaVideoTransformer3DModel, _SANA_TRANSFORMER),
        scheduler=DPMSolverMultistepScheduler(),
    )
    prompt = _prompt_pair(_SANA_TEXT_DIM, mask_dtype=torch.long)
    # ``negative_prompt`` defaults to "" here, which the call will not take with ``negative_prompt_embeds``
    base = _video_kwargs(32, 6.0, prompt, negative_prompt=None, use_resolution_binning=False)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        frames = kwargs.pop("num_frames")
        kwargs.setdefault("frames", frames)
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# Kandinsky 5 text-to-video (HunyuanVideo VAE, channels-last latents)
# ---------------------------------------------------------------------------------------------------------

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
        kwargs[f"{prefix}prompt_embeds_qwen"] = _randn(1, _TEXT_TOKENS, _KANDINSKY_QWEN_DIM, seed=seed)
        kwargs[f"{prefix}prompt_embeds_clip"] = _randn(1, _KANDINSKY_CLIP_DIM, seed=seed + 1)
        kwargs[f"{prefix}prompt_cu_seqlens"] = torch.tensor([0, _TEXT_TOKENS], dtype=torch.int32)
    return kwargs


@functools.cache
def kandinsky5_t2v() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 5 text-to-video with the HunyuanVideo VAE ``tiny_hunyuan_video`` (the pipeline reads its
    ``temporal_compression_ratio`` 4, ``spatial_compression_ratio`` 8 and ``scaling_factor``): 32×32, 9
    frames → one ``vae.decode`` of [1, 4, 3, 4, 4]; the ``"latent"`` output is channels-last
    [1, 3, 4, 4, 4] (``[B, T, h, w, C]``)."""
    pipe = _pipeline(
        Kandinsky5T2VPipeline,
        vae=tiny_hunyuan_video(),
        transformer=_seeded(Kandinsky5Transformer3DModel, _KANDINSKY_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    return pipe, _video_kwargs(32, 5.0, _kandinsky_prompt)


# ---------------------------------------------------------------------------------------------------------
# Index
# ---------------------------------------------------------------------------------------------------------

#: Builder name → builder; each builds its pipeline once per process (do not mutate what it returns).
BUILDERS: dict[str, Builder] = {
    "helios": helios,
    "helios_pyramid": helios_pyramid,
    "wan_animate": wan_animate,
    "skyreels_v2_df": skyreels_v2_df,
    "skyreels_v2_df_long": skyreels_v2_df_long,
    "sana_video": sana_video,
    "kandinsky5_t2v": kandinsky5_t2v,
}

#: Builder name → output shapes with the builder's default kwargs.
EXPECTED: dict[str, Expected] = {
    "helios": Expected(frames=(1, 65, 16, 16, 3), latents=(1, 16, 18, 2, 2)),
    "helios_pyramid": Expected(frames=(1, 65, 32, 32, 3), latents=(1, 16, 18, 4, 4)),
    "wan_animate": Expected(frames=(1, 17, 16, 16, 3), latents=(1, 16, 4, 2, 2)),
    "skyreels_v2_df": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
    "skyreels_v2_df_long": Expected(frames=(1, 17, 16, 16, 3), latents=(1, 16, 5, 2, 2)),
    "sana_video": Expected(frames=(1, 9, 32, 32, 3), latents=(1, 16, 3, 4, 4)),
    "kandinsky5_t2v": Expected(frames=(1, 9, 32, 32, 3), latents=(1, 3, 4, 4, 4)),
}
