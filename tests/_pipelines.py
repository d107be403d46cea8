"""Tiny seeded diffusers video pipelines for tests: the real pipeline classes, random weights, CPU float32.

Each builder in :data:`BUILDERS` returns ``(pipe, make_kwargs)``. ``make_kwargs(**overrides)`` returns the
keyword arguments of one call, ``pipe(**make_kwargs(), output_type="np")``: 2 inference steps, a few tiny
frames, prompt embeddings instead of a prompt (no pipeline has a text encoder or tokenizer) and a fresh
``torch.Generator().manual_seed(0)`` every time, because a call consumes its generator and two calls must
see the same noise to give the same video. ``overrides`` replace or add keys (``num_frames=17``).

A pipeline is built once per process (``functools.cache``): building one costs more than running it.
Callers must not mutate the cached pipe or its components (``vae.enable_tiling()``, attribute patches,
hooks, ``.to(...)``); a test that needs to change one builds its own from the same parts, or undoes the
change before it returns (``monkeypatch`` does).

:data:`EXPECTED` gives, for the default kwargs, the shape of ``.frames`` with ``output_type="np"``
(``[batch, frames, height, width, 3]``, values in [0, 1]) and with ``output_type="latent"`` (each family's
own layout: Wan and HunyuanVideo ``[B, C, T, h, w]``, LTX packed ``[B, T·h·w, C]``, CogVideoX frames-first
``[B, T, C, h, w]``, CogVideoX 1.5 with its ``additional_frames`` padding still in front).

Wan VAEs come from :mod:`tests._vaes` (weights re-drawn so the video spans the value range); the other
families keep diffusers' default initialisation, as diffusers' own pipeline tests do.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    AutoencoderKLHunyuanVideo,
    AutoencoderKLLTXVideo,
    CogVideoXDDIMScheduler,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
    LTXImageToVideoPipeline,
    LTXPipeline,
    LTXVideoTransformer3DModel,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModelWithProjection

from tests._vaes import tiny_wan21, tiny_wan22

__all__ = ["BUILDERS", "EXPECTED", "Expected", "MakeKwargs"]

#: ``make_kwargs(**overrides)``: one call's keyword arguments, with a fresh seeded generator.
MakeKwargs = Callable[..., dict[str, Any]]
#: A diffusers ``DiffusionPipeline`` subclass instance (diffusers' lazy top-level exports type poorly).
Pipeline = Any
Builder = Callable[[], tuple[Pipeline, MakeKwargs]]
#: Keyword arguments of one call's prompt: a fresh set of embedding tensors.
Prompt = Callable[[], dict[str, Any]]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Expected:
    """Output shapes of one builder's pipeline called with its default kwargs."""

    frames: tuple[int, ...]  # ``.frames`` with output_type="np": [batch, frames, height, width, 3]
    latents: tuple[int, ...]  # ``.frames`` with output_type="latent", in the family's own layout


# ---------------------------------------------------------------------------------------------------------
# Shared parts: seeded models, the pipe, the kwargs factory
# ---------------------------------------------------------------------------------------------------------

_TEXT_TOKENS = 16  # prompt-embedding sequence length of every family


def _seeded(model_class: Callable[..., _T], config: Mapping[str, Any]) -> _T:
    """``model_class(**config)`` right after ``torch.manual_seed(0)``: the same random weights every build."""
    torch.manual_seed(0)
    return model_class(**config)


def _pipeline(pipeline_class: Callable[..., Pipeline], **components: Any) -> Pipeline:
    """``pipeline_class(**components)`` with every text encoder and tokenizer ``None`` (the calls pass prompt
    embeddings), every model in eval mode, as ``from_pretrained`` leaves it, and no progress bar."""
    parameters = inspect.signature(pipeline_class).parameters
    no_text = {name: None for name in parameters if name.startswith(("text_encoder", "tokenizer"))}
    pipe = pipeline_class(**no_text, **components)
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _image(size: int) -> PIL.Image.Image:
    """A seeded RGB noise image ``size`` × ``size`` (a new object every call: the pipeline may keep it)."""
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def _prompt_pair(dim: int, mask_dtype: torch.dtype | None = None) -> Prompt:
    """Prompt and negative-prompt embeddings ``[1, 16, dim]`` (seeds 1 and 2), each followed by an all-ones
    attention mask of ``mask_dtype`` when one is given."""

    def prompt() -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for prefix, seed in (("", 1), ("negative_", 2)):
            kwargs[f"{prefix}prompt_embeds"] = _randn(1, _TEXT_TOKENS, dim, seed=seed)
            if mask_dtype is not None:
                kwargs[f"{prefix}prompt_attention_mask"] = torch.ones(1, _TEXT_TOKENS, dtype=mask_dtype)
        return kwargs

    return prompt


def _video_kwargs(
    size: int, guidance_scale: float, prompt: Prompt, *, image: bool = False, **fixed: Any
) -> MakeKwargs:
    """``make_kwargs`` of a ``size`` × ``size``, 9-frame call: its ``fixed`` options, then ``prompt()`` (and,
    with ``image``, a ``size`` × ``size`` image), a new generator, 2 steps, then the overrides.

    Tensors and the image are rebuilt every call so a caller that edits one in place cannot change the next.
    """
    fixed = {"height": size, "width": size, "num_frames": 9, "guidance_scale": guidance_scale, **fixed}

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = {**fixed, **prompt(), **({"image": _image(size)} if image else {})}
        kwargs |= {"generator": torch.Generator().manual_seed(0), "num_inference_steps": 2}
        kwargs.update(overrides)
        return kwargs

    return make_kwargs


# ---------------------------------------------------------------------------------------------------------
# Wan 2.1 / 2.2 (WanPipeline, WanImageToVideoPipeline)
# ---------------------------------------------------------------------------------------------------------

_WAN_TEXT_DIM = 32
#: diffusers' tiny Wan transformer (tests/pipelines/wan), less its latent channels.
_WAN_TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "text_dim": _WAN_TEXT_DIM,
    "freq_dim": 256,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32,
}
#: A tiny CLIP vision tower: WanImageToVideoPipeline will not take ``image_embeds`` with an ``image``.
_CLIP_VISION: dict[str, Any] = {
    "hidden_size": 4,
    "projection_dim": 4,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 16,
    "intermediate_size": 16,
    "patch_size": 4,
}


@dataclass(frozen=True)
class _WanVersion:
    """What a Wan release fixes: its VAE, latent channels, scheduler, video size and guidance."""

    vae: Callable[[], Any]
    channels: int
    scheduler: Callable[[], Any]
    size: int
    guidance_scale: float
    components: dict[str, Any] = field(default_factory=dict)  # more pipeline arguments


_WAN_2_1 = _WanVersion(tiny_wan21, 16, lambda: FlowMatchEulerDiscreteScheduler(shift=7.0), 16, 6.0)
_WAN_2_2 = _WanVersion(  # the TI2V-5B layout: 48 channels, 16× spatial, ``expand_timesteps``
    tiny_wan22,
    48,
    lambda: UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0),
    32,
    5.0,
    {"expand_timesteps": True},
)


def _wan(
    pipeline_class: type[WanPipeline] | type[WanImageToVideoPipeline],
    version: _WanVersion,
    transformer: Mapping[str, Any] | None = None,
    **components: Any,
) -> tuple[Pipeline, MakeKwargs]:
    """A tiny Wan pipeline of ``version``; ``transformer`` adds to its transformer's config."""
    channels = {"in_channels": version.channels, "out_channels": version.channels}
    pipe = _pipeline(
        pipeline_class,
        vae=version.vae(),
        transformer=_seeded(WanTransformer3DModel, {**_WAN_TRANSFORMER, **channels, **(transformer or {})}),
        scheduler=version.scheduler(),
        **version.components,
        **components,
    )
    image = pipeline_class is WanImageToVideoPipeline
    prompt = _prompt_pair(_WAN_TEXT_DIM)
    return pipe, _video_kwargs(version.size, version.guidance_scale, prompt, image=image)


@functools.cache
def wan21() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 text-to-video: 16×16, 9 frames → latents [1, 16, 3, 2, 2]."""
    return _wan(WanPipeline, _WAN_2_1)


@functools.cache
def wan22() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.2 TI2V-5B layout, text-to-video (48 channels, 16× spatial, ``expand_timesteps``): 32×32, 9 frames
    → latents [1, 48, 3, 2, 2]."""
    return _wan(WanPipeline, _WAN_2_2)


@functools.cache
def wan21_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 image-to-video (CLIP image embeddings, 36 input channels): 16×16, 9 frames → latents
    [1, 16, 3, 2, 2]."""
    image_encoder = _seeded(CLIPVisionModelWithProjection, {"config": CLIPVisionConfig(**_CLIP_VISION)})
    return _wan(
        WanImageToVideoPipeline,
        _WAN_2_1,
        transformer={"in_channels": 16 + 4 + 16, "image_dim": 4},  # noise, mask, condition
        image_encoder=image_encoder,
        image_processor=CLIPImageProcessorPil(crop_size=16, size=16),
    )


@functools.cache
def wan22_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.2 TI2V-5B layout, image-to-video (the image's latent replaces the first latent frame, no image
    encoder): 32×32, 9 frames → latents [1, 48, 3, 2, 2]."""
    return _wan(WanImageToVideoPipeline, _WAN_2_2)


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo
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


def _hunyuan_prompt() -> dict[str, Any]:
    return {
        "prompt_embeds": _randn(1, _TEXT_TOKENS, 16, seed=1),
        "pooled_prompt_embeds": _randn(1, 8, seed=2),
        "prompt_attention_mask": torch.ones(1, _TEXT_TOKENS),
    }


@functools.cache
def hunyuan_video() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo text-to-video (guidance-distilled): 16×16, 9 frames → latents [1, 4, 3, 2, 2]."""
    pipe = _pipeline(
        HunyuanVideoPipeline,
        transformer=_seeded(HunyuanVideoTransformer3DModel, _HUNYUAN_TRANSFORMER),
        vae=_seeded(AutoencoderKLHunyuanVideo, _HUNYUAN_VAE),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    return pipe, _video_kwargs(16, 4.5, _hunyuan_prompt)


# ---------------------------------------------------------------------------------------------------------
# LTX-Video (LTXPipeline, LTXImageToVideoPipeline)
# ---------------------------------------------------------------------------------------------------------

_LTX_TEXT_DIM = 32
_LTX_TRANSFORMER: dict[str, Any] = {
    "in_channels": 8,
    "out_channels": 8,
    "patch_size": 1,
    "patch_size_t": 1,
    "num_attention_heads": 4,
    "attention_head_dim": 8,
    "cross_attention_dim": 32,
    "num_layers": 1,
    "caption_channels": _LTX_TEXT_DIM,
}
#: As tests/test_models_ltx_video.py; temporal tiling off (diffusers' default).
_LTX_VAE: dict[str, Any] = {
    "latent_channels": 8,
    "block_out_channels": (8, 8, 8, 8),
    "decoder_block_out_channels": (8, 8, 8, 8),
    "layers_per_block": (1, 1, 1, 1, 1),
    "decoder_layers_per_block": (1, 1, 1, 1, 1),
    "patch_size": 1,
}
#: Call options of a timestep-conditioned VAE, as LTX-Video 0.9.1+ checkpoints use.
_LTX_DECODE_NOISE = {"decode_timestep": 0.05, "decode_noise_scale": 0.025}


@functools.cache  # each variant is built once per process
def _ltx(
    pipeline_class: type[LTXPipeline] | type[LTXImageToVideoPipeline], *, timestep_conditioning: bool
) -> tuple[Pipeline, MakeKwargs]:
    """A tiny LTX-Video pipeline: 8 latent channels, ``patch_size`` 1, 8× in time and space. 32×32, 9 frames
    → packed latents [1, 2·4·4, 8]. With ``timestep_conditioning`` the call decodes at ``decode_timestep``
    0.05 and mixes in noise from its generator (``decode_noise_scale`` 0.025).
    """
    vae = {**_LTX_VAE, "timestep_conditioning": timestep_conditioning}
    pipe = _pipeline(
        pipeline_class,
        transformer=_seeded(LTXVideoTransformer3DModel, _LTX_TRANSFORMER),
        vae=_seeded(AutoencoderKLLTXVideo, vae),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    prompt = _prompt_pair(_LTX_TEXT_DIM, mask_dtype=torch.long)
    decode = _LTX_DECODE_NOISE if timestep_conditioning else {}
    image = pipeline_class is LTXImageToVideoPipeline
    return pipe, _video_kwargs(32, 3.0, prompt, image=image, **decode)


#: LTX-Video text-to-video, a VAE without timestep conditioning (LTX-Video 0.9.0).
ltx = functools.partial(_ltx, LTXPipeline, timestep_conditioning=False)
#: LTX-Video text-to-video, a timestep-conditioned VAE (``vae.decode(z, decode_timestep)``).
ltx_timestep = functools.partial(_ltx, LTXPipeline, timestep_conditioning=True)
#: LTX-Video image-to-video, a VAE without timestep conditioning.
ltx_i2v = functools.partial(_ltx, LTXImageToVideoPipeline, timestep_conditioning=False)
#: LTX-Video image-to-video, a timestep-conditioned VAE.
ltx_i2v_timestep = functools.partial(_ltx, LTXImageToVideoPipeline, timestep_conditioning=True)


# ---------------------------------------------------------------------------------------------------------
# CogVideoX 1.0 / 1.5
# ---------------------------------------------------------------------------------------------------------

_COG_TEXT_DIM = 32
#: diffusers' tests/pipelines/cogvideo config, less its attention heads.
_COG_TRANSFORMER: dict[str, Any] = {
    "in_channels": 4,
    "out_channels": 4,
    "time_embed_dim": 2,
    "text_embed_dim": _COG_TEXT_DIM,
    "num_layers": 1,
    "sample_width": 2,
    "sample_height": 2,
    "sample_frames": 9,
    "patch_size": 2,
    "temporal_compression_ratio": 4,
    "max_text_seq_length": _TEXT_TOKENS,
}
_COG_VAE: dict[str, Any] = {
    "block_out_channels": (8, 8, 8, 8),
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 2,
    "temporal_compression_ratio": 4,
}


def _cogvideox(**transformer_config: Any) -> tuple[Pipeline, MakeKwargs]:
    """A tiny CogVideoX pipeline (diffusers' tests/pipelines/cogvideo config): 16×16, 9 frames."""
    pipe = _pipeline(
        CogVideoXPipeline,
        transformer=_seeded(CogVideoXTransformer3DModel, {**_COG_TRANSFORMER, **transformer_config}),
        vae=_seeded(AutoencoderKLCogVideoX, _COG_VAE),
        scheduler=CogVideoXDDIMScheduler(),
    )
    return pipe, _video_kwargs(16, 6.0, _prompt_pair(_COG_TEXT_DIM))


@functools.cache
def cogvideox() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX 1.0 (sin-cos positions, no temporal patches) → latents [1, 3, 4, 2, 2] (frames first)."""
    return _cogvideox(num_attention_heads=4, attention_head_dim=8)


@functools.cache
def cogvideox15() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX 1.5 (rotary positions, ``patch_size_t`` 2): 3 latent frames are padded to 4 in front, the
    padding is dropped before the decode → latents [1, 4, 4, 2, 2], video of 9 frames."""
    return _cogvideox(
        num_attention_heads=2,
        attention_head_dim=16,  # rotary splits it 4 / 6 / 6 over time, height, width
        patch_size_t=2,
        use_rotary_positional_embeddings=True,
    )


# ---------------------------------------------------------------------------------------------------------
# Index
# ---------------------------------------------------------------------------------------------------------

#: Builder name → builder; each builds its pipeline once per process (do not mutate what it returns).
BUILDERS: dict[str, Builder] = {
    "wan21": wan21,
    "wan22": wan22,
    "wan21_i2v": wan21_i2v,
    "wan22_i2v": wan22_i2v,
    "hunyuan_video": hunyuan_video,
    "ltx": ltx,
    "ltx_timestep": ltx_timestep,
    "ltx_i2v": ltx_i2v,
    "ltx_i2v_timestep": ltx_i2v_timestep,
    "cogvideox": cogvideox,
    "cogvideox15": cogvideox15,
}

_WAN21 = Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
_WAN22 = Expected(frames=(1, 9, 32, 32, 3), latents=(1, 48, 3, 2, 2))
_LTX = Expected(frames=(1, 9, 32, 32, 3), latents=(1, 2 * 4 * 4, 8))

#: Builder name → output shapes with the builder's default kwargs.
EXPECTED: dict[str, Expected] = {
    "wan21": _WAN21,
    "wan22": _WAN22,
    "wan21_i2v": _WAN21,
    "wan22_i2v": _WAN22,
    "hunyuan_video": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2)),
    "ltx": _LTX,
    "ltx_timestep": _LTX,
    "ltx_i2v": _LTX,
    "ltx_i2v_timestep": _LTX,
    "cogvideox": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 3, 4, 2, 2)),
    "cogvideox15": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 4, 2, 2)),
}
