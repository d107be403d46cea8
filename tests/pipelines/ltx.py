"""LTX builders: LTX-Video text and image to video (with and without a timestep-conditioned VAE), and LTX-2
text and image to video with a stereo soundtrack (``output.audio``).

Each decodes once after its loop; LTX-2 then decodes its sound (the audio VAE, then the vocoder). LTX-Video
keeps diffusers' default initialisation; LTX-2's video VAE is :mod:`tests._vaes`' ``tiny_ltx2_video``. The
LTX-2 parts (:func:`ltx2_components`, :func:`ltx2_prompt`, :data:`LTX2_AUDIO`) also serve the modular LTX-2
builders.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
    FlowMatchEulerDiscreteScheduler,
    LTX2ImageToVideoPipeline,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
    LTXImageToVideoPipeline,
    LTXPipeline,
    LTXVideoTransformer3DModel,
)
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

from tests._vaes import TINY_LTX, tiny_ltx2_video, with_small_ltx_windows
from tests.pipelines._shared import (
    ExpectedAudio,
    MakeKwargs,
    Pipeline,
    Prompt,
    builder,
    pipeline,
    prompt_pair,
    seeded,
    video_kwargs,
)

#: Call options of a timestep-conditioned VAE, as LTX-Video 0.9.1+ and LTX-2 checkpoints use: decode at
#: timestep 0.05 after mixing in noise from the call's generator.
DECODE_NOISE: dict[str, Any] = {"decode_timestep": 0.05, "decode_noise_scale": 0.025}

#: What every LTX transformer here sees of its latents: the 8 channels of the tiny LTX VAEs (these, and
#: tests._vaes'), unpatched in time and space.
_LTX_LATENTS: dict[str, Any] = {"in_channels": 8, "out_channels": 8, "patch_size": 1, "patch_size_t": 1}

# ---------------------------------------------------------------------------------------------------------
# LTX-Video (LTXPipeline, LTXImageToVideoPipeline)
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
    pipeline_class: type[LTXPipeline] | type[LTXImageToVideoPipeline], *, timestep_conditioning: bool
) -> tuple[Pipeline, MakeKwargs]:
    """A tiny LTX-Video pipeline: 8 latent channels, ``patch_size`` 1, 8× in time and space. 32×32, 9 frames
    → packed latents [1, 2·4·4, 8]. With ``timestep_conditioning`` the call decodes at ``decode_timestep``
    0.05 and mixes in noise from its generator (``decode_noise_scale`` 0.025).
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
    return pipe, video_kwargs(32, 3.0, prompt, image=image, **decode)


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


# ---------------------------------------------------------------------------------------------------------
# LTX-2 (LTX2Pipeline, LTX2ImageToVideoPipeline): video and sound
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


def _ltx2(*, timestep_conditioning: bool) -> tuple[Pipeline, MakeKwargs]:
    pipe = pipeline(LTX2Pipeline, **ltx2_components(timestep_conditioning=timestep_conditioning))
    decode = DECODE_NOISE if timestep_conditioning else {}
    return pipe, video_kwargs(32, 3.0, ltx2_prompt(), **_LTX2_GUIDANCE, **decode)


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
    pipe = pipeline(LTX2ImageToVideoPipeline, **ltx2_components(timestep_conditioning=False))
    return pipe, video_kwargs(32, 3.0, ltx2_prompt(), image=True, image_crf=0, **_LTX2_GUIDANCE)
