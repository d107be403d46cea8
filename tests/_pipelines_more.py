"""More tiny seeded diffusers video pipelines for tests: sound, newer VAEs, no step callback, modular blocks.

The same contract as :mod:`tests._pipelines` (read it first): each builder in :data:`BUILDERS` returns
``(pipe, make_kwargs)``, is built once per process (do not mutate what it returns), has no text encoder
(the calls pass prompt embeddings) and draws from a fresh ``torch.Generator().manual_seed(0)`` every call,
so two calls give the same frames (and the same sound). :data:`EXPECTED` gives the output shapes of the
default kwargs; :data:`AUDIO` the soundtrack of the builders that make one.

- ``ltx2`` / ``ltx2_timestep``: ``LTX2Pipeline``, video and a stereo soundtrack (``output.audio``).
- ``hunyuan_video15``: ``HunyuanVideo15Pipeline``, which takes no ``callback_on_step_end``.
- ``mochi``, ``allegro``: ``MochiPipeline``, ``AllegroPipeline`` (its VAE decodes only in tiles).
- ``framepack`` / ``framepack_vanilla``: ``HunyuanVideoFramepackPipeline``, which decodes once per section
  and blends each section's pixels into the ones before it.
- ``minimax_h3_modular``: MiniMax-H3's modular pipeline, text to video and audio. A modular pipeline is
  called differently: ``pipe(**make_kwargs(), output_type="np", output=["videos", "audio",
  "sampling_rate"])`` returns a dict of those outputs (without ``output=``, the whole ``PipelineState``:
  ``state.get("videos")``); there is no ``output_type="latent"``, ``output="latents"`` gives the latents.

The VAEs are :mod:`tests._vaes`' (streamvae's adapters are checked exact on them) wherever one fits; the
other models are diffusers' own tiny test configs (``get_dummy_components`` of tests/pipelines/<family> and
of the model tests), seeded, with default initialisation.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from diffusers import (
    AllegroPipeline,
    AllegroTransformer3DModel,
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    AutoencoderKLMiniMaxH3Audio,
    ClassifierFreeGuidance,
    DDIMScheduler,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
    HunyuanVideoFramepackPipeline,
    HunyuanVideoFramepackTransformer3DModel,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
    MiniMaxH3Blocks,
    MiniMaxH3ModularPipeline,
    MiniMaxH3Scheduler,
    MiniMaxH3Transformer3DModel,
    MochiPipeline,
    MochiTransformer3DModel,
)
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_TEXT_TAG
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_framepack import FramepackSamplingType
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

from tests._pipelines import (
    _TEXT_TOKENS,
    Builder,
    Expected,
    MakeKwargs,
    Pipeline,
    Prompt,
    _hunyuan_prompt,
    _pipeline,
    _prompt_pair,
    _randn,
    _seeded,
    _video_kwargs,
)
from tests._vaes import (
    TINY_LTX,
    tiny_allegro,
    tiny_hunyuan_video,
    tiny_hunyuan_video15,
    tiny_ltx2_video,
    tiny_minimax_h3,
    tiny_mochi,
    with_small_ltx_windows,
)

__all__ = ["AUDIO", "BUILDERS", "EXPECTED", "ExpectedAudio"]


@dataclass(frozen=True)
class ExpectedAudio:
    """The soundtrack of one builder's pipeline called with its default kwargs."""

    shape: tuple[int, ...]  # the waveform: [batch, channels, samples], float32
    sample_rate: int  # what streamvae muxes it at (LTX-2: the vocoder's output rate)
    latents: tuple[int, ...] | None  # the audio latents with output_type="latent" (None: no such output)


def _call_kwargs(prompt: Prompt, **fixed: Any) -> MakeKwargs:
    """``make_kwargs`` of a pipeline without a ``guidance_scale`` argument: ``fixed``, then ``prompt()``, a
    new generator and 2 steps, then the overrides (rebuilt every call, as :func:`_video_kwargs`)."""

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = {**fixed, **prompt()}
        kwargs |= {"generator": torch.Generator().manual_seed(0), "num_inference_steps": 2}
        kwargs.update(overrides)
        return kwargs

    return make_kwargs


def _eval(pipe: Pipeline) -> Pipeline:
    """Every model of ``pipe`` in eval mode, as ``from_pretrained`` leaves it."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


# ---------------------------------------------------------------------------------------------------------
# LTX-2 (LTX2Pipeline): video and sound
# ---------------------------------------------------------------------------------------------------------

#: The connectors' width (4 heads × 8), the text encoder's hidden size diffusers' tiny Gemma 3 would give.
_LTX2_CAPTION = 32
#: Hidden states the prompt embeddings stack per token (a text encoder's layers + 1), flattened:
#: ``prompt_embeds`` is ``[1, 16, 32·2]``.
_LTX2_TEXT_LAYERS = 2
#: diffusers' tests/pipelines/ltx2 transformer, with tests._vaes' 8 latent channels.
_LTX2_TRANSFORMER: dict[str, Any] = {
    "in_channels": 8,
    "out_channels": 8,
    "patch_size": 1,
    "patch_size_t": 1,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 16,
    "audio_in_channels": 4,  # audio latent channels 2 × latent mel bins 8 / 4
    "audio_out_channels": 4,
    "audio_num_attention_heads": 2,
    "audio_attention_head_dim": 4,
    "audio_cross_attention_dim": 8,
    "num_layers": 2,
    "qk_norm": "rms_norm_across_heads",
    "caption_channels": _LTX2_CAPTION,
    "rope_double_precision": False,
    "rope_type": "split",
}
_LTX2_CONNECTORS: dict[str, Any] = {
    "caption_channels": _LTX2_CAPTION,
    "text_proj_in_factor": _LTX2_TEXT_LAYERS,
    "video_connector_num_attention_heads": 4,
    "video_connector_attention_head_dim": 8,
    "video_connector_num_layers": 1,
    "video_connector_num_learnable_registers": None,
    "audio_connector_num_attention_heads": 4,
    "audio_connector_attention_head_dim": 8,
    "audio_connector_num_layers": 1,
    "audio_connector_num_learnable_registers": None,
    "connector_rope_base_seq_len": 32,
    "rope_theta": 10000.0,
    "rope_double_precision": False,
    "causal_temporal_positioning": False,
    "rope_type": "split",
}
#: diffusers' tiny audio VAE: 16 kHz, a mel frame every 160 samples, 4 mel frames a latent (25 latents/s).
_LTX2_AUDIO_VAE: dict[str, Any] = {
    "base_channels": 4,
    "output_channels": 2,
    "ch_mult": (1,),
    "num_res_blocks": 1,
    "attn_resolutions": None,
    "in_channels": 2,
    "resolution": 32,
    "latent_channels": 2,
    "norm_type": "pixel",
    "causality_axis": "height",
    "dropout": 0.0,
    "mid_block_add_attention": False,
    "sample_rate": 16000,
    "mel_hop_length": 160,
    "is_causal": True,
    "mel_bins": 8,
}
_LTX2_SAMPLE_RATE = 16000
#: diffusers' tiny vocoder upsamples 4× (a 16 kHz track 1/40 of the video's length); here it upsamples by
#: the mel hop, 10 × 16 = 160, so the stereo track at 16 kHz lasts as long as the video, as released ones do.
_LTX2_VOCODER: dict[str, Any] = {
    "in_channels": 2 * 8,  # audio VAE output channels × mel bins
    "hidden_channels": 32,
    "out_channels": 2,
    "upsample_kernel_sizes": [20, 32],
    "upsample_factors": [10, 16],
    "resnet_kernel_sizes": [3],
    "resnet_dilations": [[1, 3, 5]],
    "leaky_relu_negative_slope": 0.1,
    "output_sampling_rate": _LTX2_SAMPLE_RATE,
}
#: Spatio-temporal and modality guidance off (their defaults perturb block 28 and add two forwards a step);
#: classifier-free guidance on, for video (3.0) and sound (7.0, the default).
_LTX2_GUIDANCE: dict[str, Any] = {
    "stg_scale": 0.0,
    "modality_scale": 1.0,
    "guidance_rescale": 0.0,
    "audio_stg_scale": 0.0,
    "audio_modality_scale": 1.0,
    "audio_guidance_rescale": 0.0,
    "spatio_temporal_guidance_blocks": None,
}


def _ltx2_timestep_vae() -> AutoencoderKLLTX2Video:
    """:func:`tests._vaes.tiny_ltx2_video`'s layout and seed with ``timestep_conditioning`` (that factory
    takes no config): its decoder takes ``vae.decode(z, temb)``."""
    blocks = {"block_out_channels": (8, 16, 32, 64), "decoder_block_out_channels": (8, 16, 32)}
    layout = {"decoder_layers_per_block": (1, 1, 1, 1), "spatial_compression_ratio": 8}
    config = {**TINY_LTX, **blocks, **layout, "temporal_compression_ratio": 8, "timestep_conditioning": True}
    vae: AutoencoderKLLTX2Video = with_small_ltx_windows(_seeded(AutoencoderKLLTX2Video, config))
    return vae


@functools.cache  # each variant is built once per process
def _ltx2(*, timestep_conditioning: bool) -> tuple[Pipeline, MakeKwargs]:
    pipe = _pipeline(
        LTX2Pipeline,
        transformer=_seeded(LTX2VideoTransformer3DModel, _LTX2_TRANSFORMER),
        connectors=_seeded(LTX2TextConnectors, _LTX2_CONNECTORS),
        vae=_ltx2_timestep_vae() if timestep_conditioning else tiny_ltx2_video(),
        audio_vae=_seeded(AutoencoderKLLTX2Audio, _LTX2_AUDIO_VAE),
        vocoder=_seeded(LTX2Vocoder, _LTX2_VOCODER),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    prompt = _prompt_pair(_LTX2_CAPTION * _LTX2_TEXT_LAYERS, mask_dtype=torch.long)
    decode: dict[str, Any] = (
        {"decode_timestep": 0.05, "decode_noise_scale": 0.025} if timestep_conditioning else {}
    )
    return pipe, _video_kwargs(32, 3.0, prompt, **_LTX2_GUIDANCE, **decode)


def ltx2() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 text to video and sound (``tiny_ltx2_video``: 8 channels, 8× in time and space, small temporal
    windows): 32×32, 9 frames at 24 fps → ``.frames`` [1, 9, 32, 32, 3] and ``.audio`` [1, 2, 5280] float32
    at 16 kHz (``pipe.vocoder.config.output_sampling_rate``; ``pipe.audio_sampling_rate`` is the audio
    VAE's ``sample_rate``, which only sets how many audio latents the call makes: 9 for 0.375 s).

    One ``vae.decode(latents, None, return_dict=False)`` with latents [1, 8, 2, 4, 4] (unpacked and
    de-normalized; the timestep is ``None`` because the VAE has no ``timestep_conditioning``), then one
    ``audio_vae.decode`` of [1, 2, 9, 2] (→ mel [1, 2, 33, 8]) and the vocoder. ``output_type="latent"``
    gives ``.frames`` [1, 8, 2, 4, 4] (unpacked, de-normalized) and ``.audio`` [1, 2, 9, 2].
    """
    return _ltx2(timestep_conditioning=False)


def ltx2_timestep() -> tuple[Pipeline, MakeKwargs]:
    """:func:`ltx2` with a timestep-conditioned VAE: the call decodes at ``decode_timestep`` 0.05 after
    mixing noise from its generator into the latents (``decode_noise_scale`` 0.025), one
    ``vae.decode(latents, tensor([0.05]), return_dict=False)`` of [1, 8, 2, 4, 4]; same shapes as ``ltx2``."""
    return _ltx2(timestep_conditioning=True)


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo 1.5 (no callback_on_step_end)
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/hunyuan_video1_5 transformer: latents, condition latents and mask in.
_HUNYUAN15_TRANSFORMER: dict[str, Any] = {
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


def _hunyuan15_prompt() -> dict[str, Any]:
    """Both text encoders' embeddings (Qwen2.5-VL's [1, 16, 16], ByT5's [1, 16, 32]) with all-ones masks,
    for the prompt and the negative prompt."""
    kwargs: dict[str, Any] = {}
    for prefix, seed in (("", 1), ("negative_", 3)):
        kwargs[f"{prefix}prompt_embeds"] = _randn(1, _TEXT_TOKENS, 16, seed=seed)
        kwargs[f"{prefix}prompt_embeds_mask"] = torch.ones(1, _TEXT_TOKENS)
        kwargs[f"{prefix}prompt_embeds_2"] = _randn(1, _TEXT_TOKENS, 32, seed=seed + 1)
        kwargs[f"{prefix}prompt_embeds_mask_2"] = torch.ones(1, _TEXT_TOKENS)
    return kwargs


@functools.cache
def hunyuan_video15() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo 1.5 text to video (``tiny_hunyuan_video15``: 4 channels, 4× in time, 8× in space;
    classifier-free guidance 6.0 from its guider, the call has no ``guidance_scale``): 16×16, 9 frames →
    ``.frames`` [1, 9, 16, 16, 3]. One ``vae.decode(latents / scaling_factor, return_dict=False)`` of
    [1, 4, 3, 2, 2]; ``output_type="latent"`` gives [1, 4, 3, 2, 2]. The image embeddings of t2v are the
    pipeline's own zeros (no image encoder)."""
    pipe = _pipeline(
        HunyuanVideo15Pipeline,
        transformer=_seeded(HunyuanVideo15Transformer3DModel, _HUNYUAN15_TRANSFORMER),
        vae=tiny_hunyuan_video15(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )
    return pipe, _call_kwargs(_hunyuan15_prompt, height=16, width=16, num_frames=9)


# ---------------------------------------------------------------------------------------------------------
# Mochi, Allegro
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/mochi transformer (its VAE is tests._vaes.tiny_mochi's layout).
_MOCHI_TRANSFORMER: dict[str, Any] = {
    "patch_size": 2,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "num_layers": 2,
    "pooled_projection_dim": 16,
    "in_channels": 12,
    "out_channels": None,
    "qk_norm": "rms_norm",
    "text_embed_dim": 32,
    "time_embed_dim": 4,
    "activation_fn": "swiglu",
    "max_sequence_length": _TEXT_TOKENS,
}


@functools.cache
def mochi() -> tuple[Pipeline, MakeKwargs]:
    """Mochi text to video (``tiny_mochi``: 12 channels, 6× in time, 8× in space): 16×16, 13 frames (Mochi
    makes ``(n − 1) // 6 · 6 + 1`` of ``num_frames`` n) → ``.frames`` [1, 13, 16, 16, 3]. One
    ``vae.decode(latents · latents_std / scaling_factor + latents_mean, return_dict=False)`` (the VAE's
    default per-channel statistics, scaling factor 1) of [1, 12, 3, 2, 2]; ``output_type="latent"`` gives
    the normalized [1, 12, 3, 2, 2]."""
    pipe = _pipeline(
        MochiPipeline,
        transformer=_seeded(MochiTransformer3DModel, _MOCHI_TRANSFORMER),
        vae=tiny_mochi(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    return pipe, _video_kwargs(16, 4.5, _prompt_pair(32, mask_dtype=torch.long), num_frames=13)


#: diffusers' tests/pipelines/allegro transformer.
_ALLEGRO_TRANSFORMER: dict[str, Any] = {
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 1,
    "cross_attention_dim": 24,
    "sample_width": 8,
    "sample_height": 8,
    "sample_frames": 8,
    "caption_channels": 24,
}


@functools.cache
def allegro() -> tuple[Pipeline, MakeKwargs]:
    """Allegro text to video (``tiny_allegro``: 4 channels, 4× in time, 2× in space, tiling on with small
    tiles): 16×16, 9 frames → ``.frames`` [1, 9, 16, 16, 3]. One ``vae.decode(latents / scaling_factor)``
    (``.sample`` [1, 12, 3, 16, 16], frames first) of [1, 4, 3, 8, 8]: 3 latents decode to 12 frames, which
    the pipeline cuts to ``num_frames``. ``output_type="latent"`` gives [1, 4, 3, 8, 8].

    Keep the latent frame count odd (``num_frames`` 9, 17, …): these tiles span 3 latent frames every 2, and
    the tiled decode leaves the frames of a latent past the last whole tile black (2 latents: all of them).
    """
    pipe = _pipeline(
        AllegroPipeline,
        transformer=_seeded(AllegroTransformer3DModel, _ALLEGRO_TRANSFORMER),
        vae=tiny_allegro(),
        scheduler=DDIMScheduler(),
    )
    # negative_prompt defaults to "", which may not come with negative_prompt_embeds
    prompt = _prompt_pair(24, mask_dtype=torch.long)
    return pipe, _video_kwargs(16, 6.0, prompt, negative_prompt=None)


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo Framepack: one decode per section, blended
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/hunyuan_video framepack transformer.
_FRAMEPACK_TRANSFORMER: dict[str, Any] = {
    "in_channels": 4,
    "out_channels": 4,
    "num_attention_heads": 2,
    "attention_head_dim": 10,
    "num_layers": 1,
    "num_single_layers": 1,
    "num_refiner_layers": 1,
    "patch_size": 2,
    "patch_size_t": 1,
    "guidance_embeds": True,
    "text_embed_dim": 16,
    "pooled_projection_dim": 8,
    "rope_axes_dim": (2, 4, 4),
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


@functools.cache
def _framepack(sampling_type: FramepackSamplingType) -> tuple[Pipeline, MakeKwargs]:
    pipe = _pipeline(
        HunyuanVideoFramepackPipeline,
        transformer=_seeded(HunyuanVideoFramepackTransformer3DModel, _FRAMEPACK_TRANSFORMER),
        vae=tiny_hunyuan_video(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        image_encoder=_seeded(SiglipVisionModel, {"config": SiglipVisionConfig(**_SIGLIP_VISION)}),
        feature_extractor=SiglipImageProcessorPil(size={"height": 30, "width": 30}),
    )
    fixed = {"num_frames": 18, "latent_window_size": 3, "sampling_type": sampling_type}
    return pipe, _video_kwargs(32, 4.5, _hunyuan_prompt, image=True, **fixed)


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


def framepack_vanilla() -> tuple[Pipeline, MakeKwargs]:
    """:func:`framepack` with vanilla sampling (sections from the image forward): the same
    ``.frames`` [1, 25, 32, 32, 3]; decodes [1, 4, 4, 4, 4] (image latent and the first section → 13
    frames), then the last [1, 4, 6, 4, 4] (→ 21 frames), blended after the frames so far over 9 frames.
    ``output_type="latent"``: [1, 4, 4, 4, 4], [1, 4, 7, 4, 4]."""
    return _framepack(FramepackSamplingType.VANILLA)


# ---------------------------------------------------------------------------------------------------------
# MiniMax-H3 (modular): video and sound
# ---------------------------------------------------------------------------------------------------------

_MINIMAX_TEXT_DIM = 8
#: diffusers' tests/models/transformers MiniMax-H3 transformer, with tiny_minimax_h3's 4 latent channels
#: and the audio VAE's 8.
_MINIMAX_TRANSFORMER: dict[str, Any] = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "hidden_size": 24,
    "num_layers": 2,
    "num_refiner_layers": 2,
    "ffn_dim": 32,
    "in_channels": 4,
    "audio_in_channels": 8,
    "patch_size": (1, 2, 2),
    "text_dim": _MINIMAX_TEXT_DIM,
    "freq_dim": 8,
    "time_embed_hidden_dim": 24,
    "time_embed_dim": 16,
    "rope_freq_dim": 2,
}
#: diffusers' tests/models/autoencoders MiniMax-H3 audio VAE (a hop of 4 samples), at 160 Hz as the
#: modular tests' tiny repository has it: the pipeline makes 40 audio latents a second whatever the VAE,
#: so 160 Hz is the rate at which the soundtrack lasts as long as the video.
_MINIMAX_AUDIO_VAE: dict[str, Any] = {
    "encoder_dim": 4,
    "encoder_rates": (2, 2),
    "latent_dim": 32,
    "latent_channels": 8,
    "num_attention_heads": 2,
    "decoder_dim": 16,
    "decoder_rates": (2, 2),
    "decoder_kernel_sizes": (4, 4),
    "resblock_kernel_sizes": (3, 7),
    "resblock_dilation_sizes": ((1, 3), (1, 3)),
    # Metadata only in text-to-video+audio (the call makes 40 audio latents a second whatever it says): a
    # rate AAC takes, so the soundtrack can be muxed; its 828 samples then last 0.05 s.
    "sampling_rate": 16000,
    "latents_mean": [0.0] * 8,
    "latents_std": [1.0] * 8,
}


def _minimax_prompt() -> dict[str, Any]:
    """What the blocks' text encoder step would output: embeddings [1, 16, 8] and a text tag a row."""
    return {
        "prompt_embeds": _randn(1, _TEXT_TOKENS, _MINIMAX_TEXT_DIM, seed=1),
        "text_token_tags": torch.full((_TEXT_TOKENS,), MINIMAX_H3_TEXT_TAG, dtype=torch.long),
    }


def _quiet(blocks: Any) -> None:
    """No progress bar in any denoising loop of ``blocks`` (``ModularPipeline.set_progress_bar_config``
    reaches only the top-level blocks, and MiniMax-H3's loops sit two levels down)."""
    if hasattr(blocks, "set_progress_bar_config"):
        blocks.set_progress_bar_config(disable=True)
    sub_blocks: Mapping[str, Any] = blocks.sub_blocks or {}
    for block in sub_blocks.values():
        _quiet(block)


@functools.cache
def minimax_h3_modular() -> tuple[Pipeline, MakeKwargs]:
    """MiniMax-H3's modular pipeline, text to video and audio (``t2va``): ``MiniMaxH3Blocks`` less its text
    encoder step (the call passes ``prompt_embeds`` and ``text_token_tags``, which is what that step
    outputs), in a ``MiniMaxH3ModularPipeline`` with ``tiny_minimax_h3`` (4 channels, 4× in space, clips of
    17 frames), the tiny audio VAE, the two schedulers (shift 12 video, 3 audio) and a tiny transformer.

    Call it ``pipe(**make_kwargs(), output_type="np", output=["videos", "audio", "sampling_rate"])`` (a
    dict; ``output_type`` "np", "pt" or "pil", no "latent"). The model fixes 24 fps and 5 to 15 s, so the
    shortest call, 16×16 and 124 frames (``17·7 + 5``; other counts are rounded up to the next such), gives
    ``videos`` [1, 124, 16, 16, 3] in [0, 1], ``audio`` [1, 2, 828] float32 and ``sampling_rate`` 16000
    (``pipe.audio_vae.config.sampling_rate``). ``num_inference_steps`` 2 is one transformer call (the
    schedule counts its terminal 0); the model is guidance-distilled, there is no guidance scale.

    One ``vae.decode(latents · latents_std + latents_mean, return_dict=False)`` of [1, 4, 37, 4, 4], its
    ImageNet-normalized output mapped back (``· std + mean``) and clamped to [0, 1]; then one
    ``audio_vae.decode`` of [2, 8, 207] (the stereo channels as a batch) → ``audio`` [1, 2, 207·4].
    ``output=["latents", "audio_latents"]`` gives [1, 4, 37, 4, 4] and [2, 8, 207].
    """
    blocks: Any = MiniMaxH3Blocks()
    blocks.sub_blocks.pop("text_encoder")
    _quiet(blocks)
    pipe: Any = MiniMaxH3ModularPipeline(blocks=blocks)
    pipe.update_components(
        transformer=_seeded(MiniMaxH3Transformer3DModel, _MINIMAX_TRANSFORMER),
        vae=tiny_minimax_h3(),
        audio_vae=_seeded(AutoencoderKLMiniMaxH3Audio, _MINIMAX_AUDIO_VAE),
        scheduler=MiniMaxH3Scheduler(shift=12.0),
        audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
    )
    return _eval(pipe), _call_kwargs(_minimax_prompt, height=16, width=16, num_frames=124)


# ---------------------------------------------------------------------------------------------------------
# Index
# ---------------------------------------------------------------------------------------------------------

#: Builder name → builder; each builds its pipeline once per process (do not mutate what it returns).
BUILDERS: dict[str, Builder] = {
    "ltx2": ltx2,
    "ltx2_timestep": ltx2_timestep,
    "hunyuan_video15": hunyuan_video15,
    "mochi": mochi,
    "allegro": allegro,
    "framepack": framepack,
    "framepack_vanilla": framepack_vanilla,
    "minimax_h3_modular": minimax_h3_modular,
}

_LTX2 = Expected(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))  # latents unpacked, de-normalized
#: Framepack's latent output is a list, the history after each section: ``latents`` is the last one's.
_FRAMEPACK = Expected(frames=(1, 25, 32, 32, 3), latents=(1, 4, 7, 4, 4))

#: Builder name → output shapes with the builder's default kwargs.
EXPECTED: dict[str, Expected] = {
    "ltx2": _LTX2,
    "ltx2_timestep": _LTX2,
    "hunyuan_video15": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2)),
    "mochi": Expected(frames=(1, 13, 16, 16, 3), latents=(1, 12, 3, 2, 2)),
    "allegro": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 8, 8)),
    "framepack": _FRAMEPACK,
    "framepack_vanilla": _FRAMEPACK,
    # No output_type="latent": ``frames`` is output "videos" (output_type="np"), ``latents`` output "latents".
    "minimax_h3_modular": Expected(frames=(1, 124, 16, 16, 3), latents=(1, 4, 37, 4, 4)),
}

_LTX2_AUDIO = ExpectedAudio(shape=(1, 2, 5280), sample_rate=_LTX2_SAMPLE_RATE, latents=(1, 2, 9, 2))

#: Builder name → its soundtrack with the builder's default kwargs (``output.audio``; MiniMax-H3: output
#: "audio" at output "sampling_rate", its latents output "audio_latents").
AUDIO: dict[str, ExpectedAudio] = {
    "ltx2": _LTX2_AUDIO,
    "ltx2_timestep": _LTX2_AUDIO,
    "minimax_h3_modular": ExpectedAudio(shape=(1, 2, 828), sample_rate=160, latents=(2, 8, 207)),
}
