"""LTX builders: LTX-Video text and image to video (with and without a timestep-conditioned VAE), frame
conditions, latent upsampling and long multi-prompt windows; LTX-2 text and image to video, frame
conditions, in-context references, latent upsampling and the LTX-2.5 DFR passes, with a stereo soundtrack
(``output.audio``); and the modular LTX-Video and Echo blocks.

Each decodes once after its loop (the upsamplers have no loop); LTX-2 then decodes its sound (the audio VAE,
then the vocoder). LTX-Video keeps diffusers' default initialisation; LTX-2's video VAE is
:mod:`tests._vaes`' ``tiny_ltx2_video``. The LTX-2 parts (:func:`ltx2_components`, :func:`ltx2_prompt`,
:data:`LTX2_AUDIO`) also serve the modular LTX-2 builders.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
    ClassifierFreeGuidance,
    EchoBlocks,
    EchoModularPipeline,
    FlowMatchEulerDiscreteScheduler,
    LTX2ConditionPipeline,
    LTX2DFRPipeline,
    LTX2DFRTemporalRefinePipeline,
    LTX2HDRPipeline,
    LTX2ImageToVideoPipeline,
    LTX2InContextPipeline,
    LTX2LatentUpsamplePipeline,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
    LTXAutoBlocks,
    LTXConditionPipeline,
    LTXEulerAncestralRFScheduler,
    LTXI2VLongMultiPromptPipeline,
    LTXImageToVideoPipeline,
    LTXLatentUpsamplePipeline,
    LTXModularPipeline,
    LTXPipeline,
    LTXVideoTransformer3DModel,
)
from diffusers.pipelines.ltx.modeling_latent_upsampler import LTXLatentUpsamplerModel
from diffusers.pipelines.ltx.pipeline_ltx_condition import LTXVideoCondition
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
from diffusers.pipelines.ltx2.pipeline_ltx2_hdr_lora import LTX2HDRReferenceCondition
from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

from tests._vaes import TINY_LTX, tiny_ltx2_video, with_small_ltx_windows
from tests.pipelines._shared import (
    TEXT_TOKENS,
    ExpectedAudio,
    Finish,
    MakeKwargs,
    Pipeline,
    Prompt,
    builder,
    call_kwargs,
    eval_mode,
    noise_frames,
    noise_image,
    pipeline,
    prompt_pair,
    randn,
    seeded,
    video_kwargs,
    word_tokenizer,
)

#: Call options of a timestep-conditioned VAE, as LTX-Video 0.9.1+ and LTX-2 checkpoints use: decode at
#: timestep 0.05 after mixing in noise from the call's generator.
DECODE_NOISE: dict[str, Any] = {"decode_timestep": 0.05, "decode_noise_scale": 0.025}

#: What every LTX transformer here sees of its latents: the 8 channels of the tiny LTX VAEs (these, and
#: tests._vaes'), unpatched in time and space.
_LTX_LATENTS: dict[str, Any] = {"in_channels": 8, "out_channels": 8, "patch_size": 1, "patch_size_t": 1}

# ---------------------------------------------------------------------------------------------------------
# LTX-Video (LTXPipeline, LTXImageToVideoPipeline, LTXConditionPipeline, LTXLatentUpsamplePipeline,
# LTXI2VLongMultiPromptPipeline)
# ---------------------------------------------------------------------------------------------------------

_LTX_TEXT_DIM = 32
_LTX_TRANSFORMER: dict[str, Any] = {
    **_LTX_LATENTS,
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


def _ltx(
    pipeline_class: type[LTXPipeline] | type[LTXImageToVideoPipeline] | type[LTXConditionPipeline],
    *,
    timestep_conditioning: bool,
    finish: Finish | None = None,
) -> tuple[Pipeline, MakeKwargs]:
    """A tiny LTX-Video pipeline: 8 latent channels, ``patch_size`` 1, 8× in time and space. 32×32, 9 frames
    (a 32×32 image too for image to video, and ``finish``) → latents [1, 8, 2, 4, 4] (LTXPipeline and
    LTXImageToVideoPipeline give them packed, [1, 2·4·4, 8]). With ``timestep_conditioning`` the call
    decodes at ``decode_timestep`` 0.05 and mixes in noise from its generator (``decode_noise_scale`` 0.025).
    """
    vae = {**_LTX_VAE, "timestep_conditioning": timestep_conditioning}
    pipe = pipeline(
        pipeline_class,
        transformer=seeded(LTXVideoTransformer3DModel, _LTX_TRANSFORMER),
        vae=seeded(AutoencoderKLLTXVideo, vae),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    prompt = prompt_pair(_LTX_TEXT_DIM, mask_dtype=torch.long)
    decode = DECODE_NOISE if timestep_conditioning else {}
    image = pipeline_class is LTXImageToVideoPipeline
    return pipe, video_kwargs(32, 3.0, prompt, image=image, finish=finish, **decode)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 2 * 4 * 4, 8), core=True)
def ltx() -> tuple[Pipeline, MakeKwargs]:
    """LTX-Video text-to-video with a VAE without timestep conditioning (LTX-Video 0.9.0): 32×32, 9 frames
    → packed latents [1, 2·4·4, 8], which the pipeline unpacks and de-normalizes for its one decode."""
    return _ltx(LTXPipeline, timestep_conditioning=False)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 2 * 4 * 4, 8), core=True)
def ltx_timestep() -> tuple[Pipeline, MakeKwargs]:
    """:func:`ltx` with a timestep-conditioned VAE, as LTX-Video 0.9.1+ checkpoints have: the call mixes
    noise from its generator into the latents (``decode_noise_scale`` 0.025), then decodes at
    ``decode_timestep`` 0.05, ``vae.decode(latents, temb)``."""
    return _ltx(LTXPipeline, timestep_conditioning=True)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 2 * 4 * 4, 8), core=True)
def ltx_i2v() -> tuple[Pipeline, MakeKwargs]:
    """LTX-Video image-to-video, a VAE without timestep conditioning: a 32×32 image, whose latent
    (``vae.encode``) conditions the first latent frame; then as :func:`ltx`."""
    return _ltx(LTXImageToVideoPipeline, timestep_conditioning=False)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 2 * 4 * 4, 8), core=True)
def ltx_i2v_timestep() -> tuple[Pipeline, MakeKwargs]:
    """:func:`ltx_i2v` with :func:`ltx_timestep`'s timestep-conditioned VAE and decode."""
    return _ltx(LTXImageToVideoPipeline, timestep_conditioning=True)


def _ltx_conditions(kwargs: dict[str, Any]) -> None:
    """LTXConditionPipeline's ``conditions``: a 32×32 image at frame 0 and a one-frame video at frame 8."""
    first = LTXVideoCondition(image=noise_image(32), frame_index=0)
    last = LTXVideoCondition(video=noise_frames(1, 32, seed=5), frame_index=8)
    kwargs.setdefault("conditions", [first, last])


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def ltx_condition() -> tuple[Pipeline, MakeKwargs]:
    """LTX-Video conditioned on frames (LTX-Video 0.9.5+), with :func:`ltx_timestep`'s models and decode:
    32×32, 9 frames, ``conditions`` an image at frame 0 and a one-frame video at frame 8. The image's latent
    replaces the first latent frame; the frame at 8 is encoded into extra latent tokens, denoised with the
    video's and dropped after the loop. Then one ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 2, 4, 4]
    (unpacked, de-normalized, noise mixed in from the call's generator); ``output_type="latent"`` gives
    those latents unpacked, [1, 8, 2, 4, 4]."""
    return _ltx(LTXConditionPipeline, timestep_conditioning=True, finish=_ltx_conditions)


#: diffusers' tiny LTX-Video latent upsampler (tests/pipelines/ltx/test_ltx_latent_upsample.py): 2× in space.
_LTX_UPSAMPLER: dict[str, Any] = {"in_channels": 8, "mid_channels": 32, "num_blocks_per_stage": 1}


def _upsample_kwargs(size: int, **fixed: Any) -> MakeKwargs:
    """``make_kwargs`` of a latent upsample call: a seeded noise ``video`` of 9 ``size`` × ``size`` frames,
    encoded at that size, and a fresh generator; no prompt and no steps (the call denoises nothing)."""

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = {"height": size, "width": size, **fixed, "generator": torch.Generator().manual_seed(0)}
        kwargs |= {"video": noise_frames(9, size, seed=3), **overrides}
        return kwargs

    return make_kwargs


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def ltx_latent_upsample() -> tuple[Pipeline, MakeKwargs]:
    """LTX-Video latent upsampling: 9 noise frames, encoded at 16×16 (``vae.encode`` → [1, 8, 2, 2, 2]), 2×
    in space by the latent upsampler, then decoded as :func:`ltx_timestep` decodes, one
    ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 2, 4, 4] → 9 frames 32×32. No denoising loop (and no
    ``callback_on_step_end``); ``output_type="latent"`` gives the upsampled latents, normalized."""
    vae = {**_LTX_VAE, "timestep_conditioning": True}
    pipe = pipeline(
        LTXLatentUpsamplePipeline,
        vae=seeded(AutoencoderKLLTXVideo, vae),
        latent_upsampler=seeded(LTXLatentUpsamplerModel, _LTX_UPSAMPLER),
    )
    return pipe, _upsample_kwargs(16, **DECODE_NOISE)


#: The words of :func:`ltx_long_multi_prompt`'s prompts, for a one-word-a-token tokenizer.
_LONG_WORDS = ("[PAD]", "[UNK]", "a", "cat", "dog", "walks", "runs")
#: A tiny T5 encoder whose hidden size is the transformer's ``caption_channels``.
_LONG_T5: dict[str, Any] = {"d_model": _LTX_TEXT_DIM, "d_kv": 8, "d_ff": 37, "num_layers": 1, "num_heads": 4}


def _long_text_models() -> tuple[PreTrainedTokenizerFast, T5EncoderModel]:
    """A word-level tokenizer (padding ``[PAD]``) and a seeded tiny T5 encoder: LTXI2VLongMultiPromptPipeline
    encodes each window's prompt itself and takes no prompt embeddings."""
    tokenizer = word_tokenizer(_LONG_WORDS, pad_token="[PAD]")
    config = T5Config(vocab_size=len(_LONG_WORDS), **_LONG_T5)
    return tokenizer, seeded(T5EncoderModel, {"config": config})


def _long_inputs() -> dict[str, Any]:
    return {"cond_image": noise_image(32)}


@builder(frames=(1, 17, 32, 32, 3), latents=(1, 8, 3, 4, 4))
def ltx_long_multi_prompt() -> tuple[Pipeline, MakeKwargs]:
    """LTX-Video image to video in temporal windows, a prompt a window (``"a cat walks|a dog runs"``), with
    :func:`ltx_timestep`'s models, a tiny T5 and the ancestral scheduler its docs ask for: a 32×32
    ``cond_image`` conditioning the first latent frame, 32×32, 17 frames (3 latent frames) in windows of 2
    latent frames overlapping by 1 (``temporal_tile_size`` 16, ``temporal_overlap`` 8), the second window's
    latents fused into the first's. Then its ``vae_decode_tiled`` with one tile
    (``decode_horizontal_tiles`` = ``decode_vertical_tiles`` = 1; the default 4 × 4 decodes each tile in a
    call of its own, which streamvae refuses): the last latent frame repeated, one
    ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 4, 4, 4] → 25 frames, clamped, the last 8 dropped →
    ``.frames`` [1, 17, 32, 32, 3]. ``output_type="latent"`` (its default) gives [1, 8, 3, 4, 4]."""
    tokenizer, text_encoder = _long_text_models()
    pipe = LTXI2VLongMultiPromptPipeline(
        transformer=seeded(LTXVideoTransformer3DModel, _LTX_TRANSFORMER),
        vae=seeded(AutoencoderKLLTXVideo, {**_LTX_VAE, "timestep_conditioning": True}),
        scheduler=LTXEulerAncestralRFScheduler(),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )
    eval_mode(pipe).set_progress_bar_config(disable=True)
    windows = {"temporal_tile_size": 16, "temporal_overlap": 8, "max_sequence_length": TEXT_TOKENS}
    tiles = {"decode_horizontal_tiles": 1, "decode_vertical_tiles": 1}
    fixed = {
        "prompt": "a cat walks|a dog runs",
        "negative_prompt": "",
        "guidance_scale": 3.0,
        **windows,
        **tiles,
    }
    return pipe, call_kwargs(_long_inputs, height=32, width=32, num_frames=17, **fixed)


# ---------------------------------------------------------------------------------------------------------
# LTX-2 (LTX2Pipeline, LTX2ImageToVideoPipeline, LTX2ConditionPipeline, LTX2InContextPipeline): video and
# sound; LTX2LatentUpsamplePipeline: video
# ---------------------------------------------------------------------------------------------------------

#: The connectors' width (4 heads × 8), the text encoder's hidden size diffusers' tiny Gemma 3 would give.
_LTX2_CAPTION = 32
#: Hidden states the prompt embeddings stack per token (a text encoder's layers + 1), flattened:
#: ``prompt_embeds`` is ``[1, 16, 32·2]``.
_LTX2_TEXT_LAYERS = 2
#: diffusers' tests/pipelines/ltx2 transformer, with tests._vaes' 8 latent channels.
_LTX2_TRANSFORMER: dict[str, Any] = {
    **_LTX_LATENTS,
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
#: The soundtrack of every LTX-2 builder's default call: 9 frames at 24 fps of stereo at 16 kHz (the
#: vocoder's ``output_sampling_rate``), from audio latents [1, 2, 9, 2].
LTX2_AUDIO = ExpectedAudio(shape=(1, 2, 5280), sample_rate=_LTX2_SAMPLE_RATE, latents=(1, 2, 9, 2))


def _ltx2_timestep_vae() -> AutoencoderKLLTX2Video:
    """:func:`tests._vaes.tiny_ltx2_video`'s layout and seed with ``timestep_conditioning`` (that factory
    takes no config): its decoder takes ``vae.decode(z, temb)``."""
    blocks = {"block_out_channels": (8, 16, 32, 64), "decoder_block_out_channels": (8, 16, 32)}
    layout = {"decoder_layers_per_block": (1, 1, 1, 1), "spatial_compression_ratio": 8}
    config = {**TINY_LTX, **blocks, **layout, "temporal_compression_ratio": 8, "timestep_conditioning": True}
    vae: AutoencoderKLLTX2Video = with_small_ltx_windows(seeded(AutoencoderKLLTX2Video, config))
    return vae


def ltx2_components(*, timestep_conditioning: bool) -> dict[str, Any]:
    """The models of an LTX-2 pipeline: the tiny transformer, text connectors, audio VAE and vocoder
    (seeded), the video VAE (``tiny_ltx2_video``, or its timestep-conditioned twin) and the scheduler."""
    return {
        "transformer": seeded(LTX2VideoTransformer3DModel, _LTX2_TRANSFORMER),
        "connectors": seeded(LTX2TextConnectors, _LTX2_CONNECTORS),
        "vae": _ltx2_timestep_vae() if timestep_conditioning else tiny_ltx2_video(),
        "audio_vae": seeded(AutoencoderKLLTX2Audio, _LTX2_AUDIO_VAE),
        "vocoder": seeded(LTX2Vocoder, _LTX2_VOCODER),
        "scheduler": FlowMatchEulerDiscreteScheduler(),
    }


def ltx2_prompt() -> Prompt:
    """LTX-2's prompt embeddings ``[1, 16, 32·2]`` (the text encoder's stacked hidden states) with all-ones
    masks, for the prompt and the negative prompt."""
    return prompt_pair(_LTX2_CAPTION * _LTX2_TEXT_LAYERS, mask_dtype=torch.long)


def _ltx2(
    pipeline_class: Any = LTX2Pipeline,
    *,
    timestep_conditioning: bool,
    finish: Finish | None = None,
    **fixed: Any,
) -> tuple[Pipeline, MakeKwargs]:
    """An LTX-2 pipeline of :func:`ltx2_components` and its call: 32×32, 9 frames, classifier-free guidance
    3.0 and the rest off (``_LTX2_GUIDANCE``), :data:`DECODE_NOISE` with a timestep-conditioned VAE, then
    ``fixed`` and ``finish`` (:func:`tests.pipelines._shared.video_kwargs`)."""
    pipe = pipeline(pipeline_class, **ltx2_components(timestep_conditioning=timestep_conditioning))
    decode = DECODE_NOISE if timestep_conditioning else {}
    return pipe, video_kwargs(32, 3.0, ltx2_prompt(), finish=finish, **_LTX2_GUIDANCE, **decode, **fixed)


# latents unpacked, de-normalized
@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
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


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def ltx2_timestep() -> tuple[Pipeline, MakeKwargs]:
    """:func:`ltx2` with a timestep-conditioned VAE: the call decodes at ``decode_timestep`` 0.05 after
    mixing noise from its generator into the latents (``decode_noise_scale`` 0.025), one
    ``vae.decode(latents, tensor([0.05]), return_dict=False)`` of [1, 8, 2, 4, 4]; same shapes as ``ltx2``."""
    return _ltx2(timestep_conditioning=True)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def ltx2_i2v() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 image to video and sound, the parts of :func:`ltx2` (``tiny_ltx2_video``, the tiny audio VAE
    and a vocoder upsampling by the mel hop): a 32×32 image, 9 frames at 24 fps → ``.frames``
    [1, 9, 32, 32, 3] and ``.audio`` [1, 2, 5280] float32 at 16 kHz
    (``pipe.vocoder.config.output_sampling_rate``; ``pipe.audio_sampling_rate`` is the audio VAE's
    ``sample_rate``, also 16000).

    ``vae.encode`` of the image (its latent conditions the first latent frame), then one
    ``vae.decode(latents, None, return_dict=False)`` of [1, 8, 2, 4, 4] (unpacked, de-normalized), then one
    ``audio_vae.decode`` of [1, 2, 9, 2] and the vocoder, as LTX2Pipeline. ``image_crf`` is 0: the default
    (33) re-encodes the image through H.264 first, and x264 on a frame narrower than 64 pixels is not
    bit-reproducible. ``output_type="latent"``: ``.frames`` [1, 8, 2, 4, 4], ``.audio`` [1, 2, 9, 2]. About
    0.15 s a call on 2 CPU cores.
    """
    return _ltx2(LTX2ImageToVideoPipeline, timestep_conditioning=False, image=True, image_crf=0)


def _ltx2_conditions(kwargs: dict[str, Any]) -> None:
    """LTX2ConditionPipeline's ``conditions``: a 32×32 image at latent frame 0 and a one-frame video at the
    last latent frame (-1), neither re-encoded through H.264 (``crf`` 0: see :func:`ltx2_i2v`)."""
    first = LTX2VideoCondition(frames=noise_image(32), index=0, crf=0)
    last = LTX2VideoCondition(frames=noise_frames(1, 32, seed=5), index=-1, crf=0)
    kwargs.setdefault("conditions", [first, last])


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def ltx2_condition() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 conditioned on frames, with :func:`ltx2_timestep`'s models and decode: 32×32, 9 frames at
    24 fps, ``conditions`` an image at latent frame 0 and a one-frame video at the last one, each
    ``vae.encode``d into the latents it conditions. One ``vae.decode(latents, tensor([0.05]))`` of
    [1, 8, 2, 4, 4], then the audio VAE and the vocoder: ``.frames`` [1, 9, 32, 32, 3] and ``.audio``
    [1, 2, 5280] at 16 kHz. ``output_type="latent"``: [1, 8, 2, 4, 4] and [1, 2, 9, 2]."""
    return _ltx2(LTX2ConditionPipeline, timestep_conditioning=True, finish=_ltx2_conditions)


def _ltx2_reference(kwargs: dict[str, Any]) -> None:
    """LTX2InContextPipeline's ``reference_conditions``: a 9-frame 32×32 noise video."""
    kwargs.setdefault("reference_conditions", [LTX2ReferenceCondition(frames=noise_frames(9, 32, seed=6))])


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def ltx2_in_context() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 in-context (IC-LoRA) generation, with :func:`ltx2_timestep`'s models and decode and no LoRA
    loaded (the call's code is the same): a 9-frame 32×32 reference video is ``vae.encode``d into tokens
    the transformer attends to beside the video's, dropped after the loop. One
    ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 2, 4, 4], then the audio VAE and the vocoder: shapes
    as :func:`ltx2_condition`."""
    return _ltx2(LTX2InContextPipeline, timestep_conditioning=True, finish=_ltx2_reference)


def _hdr_reference(kwargs: dict[str, Any]) -> None:
    """LTX2HDRPipeline's ``reference_conditions``: the SDR video to lift, 9 frames 32×32 of noise."""
    kwargs.setdefault("reference_conditions", [LTX2HDRReferenceCondition(frames=noise_frames(9, 32, seed=6))])


# refused (tests/test_generate_every.py's REFUSED): its frames are linear HDR light, not [0, 1]
@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def ltx2_hdr() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 HDR (the HDR IC-LoRA pipeline, no LoRA loaded), with :func:`ltx2_timestep`'s models and decode:
    a 9-frame 32×32 reference video, 32×32, 9 frames, guidance 1.0 (its default). One
    ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 2, 4, 4], then its HDR post-processing: the decode
    LogC3-decompressed into linear light, ``.frames`` [1, 9, 32, 32, 3] float32 with values up to about 48
    here (unbounded above), and no sound (``.audio`` None). ``output_type="latent"``: [1, 8, 2, 4, 4]."""
    pipe = pipeline(LTX2HDRPipeline, **ltx2_components(timestep_conditioning=True))
    return pipe, video_kwargs(32, 1.0, ltx2_prompt(), finish=_hdr_reference, **DECODE_NOISE)


#: A tiny LTX-2 latent upsampler: 2× in space, with the rational resampler of the released one.
_LTX2_UPSAMPLER: dict[str, Any] = {"in_channels": 8, "mid_channels": 32, "num_blocks_per_stage": 1}


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def ltx2_latent_upsample() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 latent upsampling with ``tiny_ltx2_video`` (no timestep conditioning): 9 noise frames, encoded
    at 16×16 (``vae.encode`` → [1, 8, 2, 2, 2]), 2× in space by the latent upsampler, then one
    ``vae.decode(latents, None)`` of [1, 8, 2, 4, 4] → 9 frames 32×32, no sound. No denoising loop;
    ``output_type="latent"`` gives the upsampled latents."""
    pipe = pipeline(
        LTX2LatentUpsamplePipeline,
        vae=tiny_ltx2_video(),
        latent_upsampler=seeded(LTX2LatentUpsamplerModel, _LTX2_UPSAMPLER),
    )
    return pipe, _upsample_kwargs(16)


# ---------------------------------------------------------------------------------------------------------
# LTX-2.5 DFR (LTX2DFRPipeline, LTX2DFRTemporalRefinePipeline): distilled passes, video and sound
# ---------------------------------------------------------------------------------------------------------

#: Two distilled steps (the released schedules have 8 and 4); the passes take sigmas, not a step count.
_DFR_SIGMAS = [1.0, 0.5]


def _dfr_components(**models: Any) -> dict[str, Any]:
    """:func:`ltx2_components` (the timestep-conditioned VAE) with a transformer that embeds the keyframe
    slots' absolute positions (``use_keyframes_abs_pos_embedding``, as LTX-2.5's), and ``models`` added."""
    transformer = {**_LTX2_TRANSFORMER, "use_keyframes_abs_pos_embedding": True}
    components = ltx2_components(timestep_conditioning=True)
    return {**components, "transformer": seeded(LTX2VideoTransformer3DModel, transformer), **models}


def _dfr_prompt() -> dict[str, Any]:
    """:func:`ltx2_prompt`'s prompt embeddings and mask, no negative prompt: the DFR passes are distilled,
    without classifier-free guidance."""
    return {name: value for name, value in ltx2_prompt()().items() if not name.startswith("negative_")}


def _sigmas_not_steps(kwargs: dict[str, Any]) -> None:
    kwargs.pop("num_inference_steps")  # the passes take ``sigmas``


@builder(
    frames=(1, 9, 32, 32, 3), latents=(1, 8, 4, 4, 4), audio=ExpectedAudio((1, 2, 6000), 16000, (1, 2, 26, 2))
)
def ltx2_dfr() -> tuple[Pipeline, MakeKwargs]:
    """One LTX-2.5 DFR (Diffusion Fidelity Rendering) pass, text to video and sound, generating its keyframe
    slots: 32×32, 9 frames at 24 fps, two distilled steps. The pass denoises a canvas padded to whole
    segments, 25 frames (4 latent frames), and one keyframe slot at frame 24; it trims the canvas back to
    the 9 frames asked for and decodes once, ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 2, 4, 4], then
    the audio VAE and the vocoder, the waveform cut to the 9 frames' length: ``.frames`` [1, 9, 32, 32, 3]
    and ``.audio`` [1, 2, 6000] at 16 kHz. ``output_type="latent"`` gives the padded canvas [1, 8, 4, 4, 4],
    the audio latents [1, 2, 26, 2] and the slot's latents [1, 8, 1, 4, 4] at position 24."""
    pipe = pipeline(LTX2DFRPipeline, **_dfr_components())
    fixed = {"height": 32, "width": 32, "num_frames": 9, "sigmas": _DFR_SIGMAS, **DECODE_NOISE}
    return pipe, call_kwargs(_dfr_prompt, finish=_sigmas_not_steps, **fixed)


def _dfr_round_input() -> dict[str, Any]:
    """What a DFR pass at 9 frames would hand a temporal round (seeded noise of its shapes, raw): the video
    latents [1, 8, 2, 4, 4] (a 9-frame canvas), one carry keyframe [1, 8, 1, 4, 4] at frame 8 and the audio
    latents [1, 2, 9, 2]; with :func:`_dfr_prompt`'s embeddings."""
    return {
        **_dfr_prompt(),
        "latents": randn(1, 8, 2, 4, 4, seed=7),
        "keyframes_latents": randn(1, 8, 1, 4, 4, seed=8),
        "keyframe_positions": [8],
        "audio_latents": randn(1, 2, 9, 2, seed=9),
    }


#: A tiny LTX-2 temporal latent upsampler: 2× in time.
_LTX2_TEMPORAL_UPSAMPLER: dict[str, Any] = {
    **_LTX2_UPSAMPLER,
    "spatial_upsample": False,
    "temporal_upsample": True,
}


@builder(frames=(1, 17, 32, 32, 3), latents=(1, 8, 3, 4, 4), audio=LTX2_AUDIO)
def ltx2_dfr_temporal_refine() -> tuple[Pipeline, MakeKwargs]:
    """One LTX-2.5 DFR temporal refine round (:func:`_dfr_round_input`'s 9-frame canvas at 24 fps, two
    distilled steps, the ancestral scheduler at ``eta`` 0.5): the temporal upsampler doubles the canvas to
    17 frames (3 latent frames), which the round denoises in tiles cut at the keyframes and stitches back,
    then decodes once, ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 3, 4, 4]: ``.frames``
    [1, 17, 32, 32, 3]. Its sound is the frozen input audio's, through the audio VAE and the vocoder:
    ``.audio`` [1, 2, 5280] at 16 kHz. ``output_type="latent"``: [1, 8, 3, 4, 4], the audio latents
    [1, 2, 9, 2] and carry keyframes [1, 8, 2, 4, 4] at frames 8 and 16."""
    upsampler = seeded(LTX2LatentUpsamplerModel, _LTX2_TEMPORAL_UPSAMPLER)
    scheduler = LTXEulerAncestralRFScheduler(eta=0.5)
    components = _dfr_components(scheduler=scheduler, temporal_latent_upsampler=upsampler)
    pipe = pipeline(LTX2DFRTemporalRefinePipeline, **components)
    fixed = {"height": 32, "width": 32, "num_frames": 9, "sigmas": _DFR_SIGMAS, **DECODE_NOISE}
    return pipe, call_kwargs(_dfr_round_input, finish=_sigmas_not_steps, **fixed)


# ---------------------------------------------------------------------------------------------------------
# Modular: LTX-Video (LTXAutoBlocks) and Echo (EchoBlocks, LTX-2 models), built with tests.pipelines.modular's
# helpers (imported where used: that module imports this one)
# ---------------------------------------------------------------------------------------------------------


def _ltx_modular(*, image: bool) -> tuple[Pipeline, MakeKwargs]:
    from tests.pipelines.modular import _modular

    pipe = _modular(
        LTXModularPipeline,
        LTXAutoBlocks(),
        transformer=seeded(LTXVideoTransformer3DModel, _LTX_TRANSFORMER),
        vae=seeded(AutoencoderKLLTXVideo, {**_LTX_VAE, "timestep_conditioning": True}),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        guider=ClassifierFreeGuidance(guidance_scale=3.0),
    )
    prompt = prompt_pair(_LTX_TEXT_DIM, mask_dtype=torch.long)
    size = {"height": 32, "width": 32, "num_frames": 9}
    return pipe, call_kwargs(prompt, image=32 if image else None, **size, **DECODE_NOISE)


# ``latents``: output "latents", unpacked by the denoise step
@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def ltx_modular() -> tuple[Pipeline, MakeKwargs]:
    """LTX-Video text to video, ``LTXAutoBlocks`` (its ``text2video`` workflow, the T5 step dropped) in an
    ``LTXModularPipeline`` with :func:`ltx_timestep`'s models (classifier-free guidance 3.0 from its guider):
    32×32, 9 frames → one ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 2, 4, 4] (de-normalized, noise
    from the call's generator mixed in) → ``videos`` [1, 9, 32, 32, 3]; ``output="latents"`` gives the
    unpacked [1, 8, 2, 4, 4]."""
    return _ltx_modular(image=False)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def ltx_i2v_modular() -> tuple[Pipeline, MakeKwargs]:
    """:func:`ltx_modular`'s ``image2video`` workflow: a 32×32 ``image``, ``vae.encode``d into the first
    latent frame, then the same decode and shapes."""
    return _ltx_modular(image=True)


def _echo_prompt() -> dict[str, Any]:
    """What Echo's Gemma step outputs: :func:`_dfr_prompt`'s positive embeddings and mask (the DMD model is
    guidance-free), and one memory image, a 32×32 noise image (seed 0's, as ``image``)."""
    return {**_dfr_prompt(), "memory_images": [noise_image(32)]}


# ``latents``: output "videos" with output_type="latent" (de-normalized); the soundtrack is output "audio"
@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def echo_modular() -> tuple[Pipeline, MakeKwargs]:
    """Echo reference-to-video and sound, ``EchoBlocks`` (its Gemma step dropped, the connectors kept) in an
    ``EchoModularPipeline`` with :func:`ltx2_timestep`'s models: a clean first frame (``image``, 32×32), one
    memory image, 32×32, 9 frames at 25 fps, the DMD schedule ``sigmas`` [1.0, 0.5, 0.0] (two steps).
    One ``vae.decode(latents, tensor([0.05]))`` of [1, 8, 2, 4, 4], then the audio VAE and the vocoder:
    ``videos`` [1, 9, 32, 32, 3] and ``audio`` [1, 2, 5280] at 16 kHz. ``output_type="latent"``: ``videos``
    [1, 8, 2, 4, 4], ``audio`` [1, 2, 9, 2]."""
    from tests.pipelines.modular import _modular, _padding_tokenizer

    models = ltx2_components(timestep_conditioning=True)
    del models["scheduler"]  # its DMD loop steps by its own sigmas
    pipe = _modular(
        EchoModularPipeline,
        EchoBlocks(),
        drop=("text_encoder.encode",),
        **models,
        tokenizer=_padding_tokenizer(),
    )
    fixed = {"height": 32, "width": 32, "num_frames": 9, "sigmas": [*_DFR_SIGMAS, 0.0], **DECODE_NOISE}
    return pipe, call_kwargs(_echo_prompt, image=32, finish=_sigmas_not_steps, **fixed)


# ---------------------------------------------------------------------------------------------------------
# LTX-2.5's diffusion decoder (LTX2VideoDiffusionDecodePipeline, the modular LTX25AutoBlocks): the video made
# by a diffusion model in place of vae.decode
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tiny diffusion decoder (tests/pipelines/ltx2/test_ltx2_diffusion_decode.py) at 8× in space
#: and time, as ``tiny_ltx2_video``: latents [1, 8, 2, 4, 4] → 9 frames 32×32. Its stages run on grids of
#: 4×4 latents (every kernel 3 fits), the last one on 8×8 patches of 4 pixels; one x0 step, its default.
_DIFFUSION_DECODER: dict[str, Any] = {
    "out_channels": 3,
    "latent_channels": 8,
    "patch_size": 4,
    "decoder_head_dim": 8,
    "decoder_stage_channels": (32, 16, 16, 16, 16),
    "decoder_stage_depths": (1, 1, 1, 1, 1),
    "decoder_stage_kernels": ((3, 3, 3),) * 4,
    "decoder_upsample_strides": ((1, 1, 1), (2, 1, 1), (2, 1, 1), (2, 2, 2)),
    "decoder_upsample_channel_reductions": (2, 1, 1, 1),
    "decoder_stage5_kernel": (3, 3, 3),
    "decoder_t_emb_dim": 16,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 8,
}


def _diffusion_decoder() -> Any:
    from diffusers import LTX2VideoDiffusionDecoderModel

    return seeded(LTX2VideoDiffusionDecoderModel, _DIFFUSION_DECODER)


def _decode_inputs() -> dict[str, Any]:
    """The latents an LTX-2 pipeline run with ``output_type="latent"`` would hand the decode pipeline
    (seeded noise of their shape), normalized: the pipeline de-normalizes them with the decoder's
    statistics."""
    return {"latents": randn(1, 8, 2, 4, 4, seed=10)}


def _decode_only(kwargs: dict[str, Any]) -> None:
    kwargs.pop("num_inference_steps")  # one pass of the decoder's own steps: the call takes no count


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))
def ltx2_diffusion_decode() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2.5's diffusion decode of given latents [1, 8, 2, 4, 4], with no VAE (it is optional): the
    pipeline de-normalizes them with the decoder's own statistics and calls
    ``diffusion_decoder.decode(latents, generator=…, return_dict=False)``, which denoises all 9 frames
    32×32 together from noise drawn from the call's generator, in one x0 step: ``.frames``
    [1, 9, 32, 32, 3], no sound. ``latents`` here is the call's input; it has no latent output."""
    from diffusers import LTX2VideoDiffusionDecodePipeline

    pipe = pipeline(
        LTX2VideoDiffusionDecodePipeline,
        diffusion_decoder=_diffusion_decoder(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
    )
    return pipe, call_kwargs(_decode_inputs, finish=_decode_only)


# ``latents``: output "videos" with output_type="latent" (unpacked, de-normalized); the soundtrack is output
# "audio", as ltx2_modular's
@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def ltx25_modular() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2.5 text to video and sound, ``LTX25AutoBlocks`` (the prompt enhancer and the Gemma step
    dropped, the text connectors kept) in an ``LTX25ModularPipeline``: :mod:`tests.pipelines.modular`'s
    ``ltx2_modular`` with the tiny diffusion decoder added (``tiny_ltx2_video`` stays: its compression
    ratios and latent statistics are the blocks'). 32×32, 9 frames; the decode step unpacks and
    de-normalizes the latents [1, 8, 2, 4, 4] and calls ``diffusion_decoder.decode(latents,
    generator=…)`` (no ``vae.decode``), then the audio VAE and the vocoder: ``videos`` [1, 9, 32, 32, 3]
    and ``audio`` [1, 2, 5280] at 16 kHz."""
    from diffusers import LTX2Guidance, LTX25AutoBlocks, LTX25ModularPipeline

    from tests.pipelines.modular import _ltx2_prompt, _modular, _padding_tokenizer

    pipe = _modular(
        LTX25ModularPipeline,
        LTX25AutoBlocks(),
        drop=("prompt_enhancer", "text_encoder.text_encoder"),
        **ltx2_components(timestep_conditioning=False),
        diffusion_decoder=_diffusion_decoder(),
        tokenizer=_padding_tokenizer(),
        guider=LTX2Guidance(guidance_scale=3.0),
        audio_guider=LTX2Guidance(guidance_scale=7.0),
    )
    return pipe, call_kwargs(_ltx2_prompt, height=32, width=32, num_frames=9)
