"""Modular builders: diffusers' ``ModularPipeline`` of Wan 2.1 / 2.2, Helios, HunyuanVideo 1.5, LTX-2,
Wan-Animate-2 and MiniMax-H3, on the models of their families' standard builders.

Each pipe is a ``ModularPipeline`` around diffusers' own blocks class less its text encoder step: the
call passes what that step outputs (``prompt_embeds``, ``negative_prompt_embeds``, ...). The models are
set with ``update_components`` (seeded, eval mode) and the progress bars the blocks let one configure are
off (Helios's and Wan-Animate-2's loops use a bare ``tqdm``). A modular pipeline is called
``pipe(**make_kwargs(), output_type="np", output=["videos"])`` and returns a dict of those outputs
(without ``output=``, the whole ``PipelineState``: ``state.get("videos")``); there is no
``guidance_scale`` argument (each pipe's guider component sets it) and, but for LTX-2, no
``output_type="latent"``: ``output="latents"`` gives the denoised latents.

- ``wan21_modular`` / ``wan22_modular`` / ``wan21_i2v_modular``: ``WanBlocks``, ``Wan22Blocks`` (two
  transformers), ``WanImage2VideoAutoBlocks``; one decode after the loop.
- ``hunyuan_video15_modular``: ``HunyuanVideo15AutoBlocks``, text to video; one decode.
- ``helios_modular``: ``HeliosAutoBlocks``; one decode per chunk, all after the chunk loop.
- ``ltx2_modular`` / ``ltx2_timestep_modular``: ``LTX2AutoBlocks``, video and a stereo soundtrack; one
  decode.
- ``wan_animate2_modular``: ``WanAnimate2Blocks``; one decode per segment, inside the segment loop.
- ``minimax_h3_modular``: ``MiniMaxH3Blocks``, text to video and audio; one decode.
- ``wan22_i2v_modular`` / ``wan22_vace_modular``: ``Wan22Image2VideoBlocks``, ``Wan22VaceBlocks`` (two
  transformers); one decode after the loop.
- ``helios_pyramid_modular`` / ``helios_pyramid_distilled_modular``: ``HeliosPyramidAutoBlocks``,
  ``HeliosPyramidDistilledAutoBlocks``; one decode per chunk, all after the chunk loop.
- ``wan_animate2_distilled_modular``: ``WanAnimate2DistilledBlocks``; one decode per segment, inside the
  segment loop.

The index's shapes (:data:`tests.pipelines.EXPECTED`): ``frames`` is output ``"videos"`` with
``output_type="np"``, ``latents`` the blocks' latent output (see each builder).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from diffusers import (
    AutoencoderKLMiniMaxH3Audio,
    ClassifierFreeGuidance,
    ClassifierFreeZeroStarGuidance,
    FlowMatchEulerDiscreteScheduler,
    HeliosAutoBlocks,
    HeliosDMDScheduler,
    HeliosModularPipeline,
    HeliosPyramidAutoBlocks,
    HeliosPyramidDistilledAutoBlocks,
    HeliosPyramidDistilledModularPipeline,
    HeliosPyramidModularPipeline,
    HeliosScheduler,
    HeliosTransformer3DModel,
    HunyuanVideo15AutoBlocks,
    HunyuanVideo15ModularPipeline,
    LTX2AutoBlocks,
    LTX2Guidance,
    LTX2ModularPipeline,
    MiniMaxH3Blocks,
    MiniMaxH3ModularPipeline,
    MiniMaxH3Scheduler,
    MiniMaxH3Transformer3DModel,
    Wan22Blocks,
    Wan22Image2VideoBlocks,
    Wan22Image2VideoModularPipeline,
    Wan22ModularPipeline,
    Wan22VaceBlocks,
    Wan22VaceModularPipeline,
    WanAnimate2Blocks,
    WanAnimate2DistilledBlocks,
    WanAnimate2DistilledModularPipeline,
    WanAnimate2ModularPipeline,
    WanAnimate2Transformer3DModel,
    WanBlocks,
    WanImage2VideoAutoBlocks,
    WanImage2VideoModularPipeline,
    WanModularPipeline,
    WanTransformer3DModel,
    WanVACETransformer3DModel,
)
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_TEXT_TAG
from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModel, PreTrainedTokenizerFast

from tests._vaes import tiny_minimax_h3, tiny_wan21
from tests.pipelines._shared import (
    TEXT_TOKENS,
    ExpectedAudio,
    MakeKwargs,
    Pipeline,
    builder,
    call_kwargs,
    eval_mode,
    noise_frames,
    prompt_pair,
    randn,
    seeded,
    word_tokenizer,
)
from tests.pipelines.helios import HELIOS_FRAMES, HELIOS_TRANSFORMER
from tests.pipelines.hunyuan import hunyuan15_components, hunyuan15_prompt
from tests.pipelines.ltx import DECODE_NOISE, LTX2_AUDIO, ltx2_components, ltx2_prompt
from tests.pipelines.wan import (
    _VACE_TRANSFORMER,
    CLIP_VISION,
    WAN21_TRANSFORMER,
    WAN_TEXT_DIM,
    _vace_inputs,
    flow_unipc,
)


def _quiet(blocks: Any) -> None:
    """No progress bar in any denoising loop of ``blocks`` (``ModularPipeline.set_progress_bar_config``
    reaches only the top-level blocks, and MiniMax-H3's loops sit two levels down)."""
    if hasattr(blocks, "set_progress_bar_config"):
        blocks.set_progress_bar_config(disable=True)
    sub_blocks: Mapping[str, Any] = blocks.sub_blocks or {}
    for block in sub_blocks.values():
        _quiet(block)


def _modular(
    pipeline_class: type[Any], blocks: Any, drop: tuple[str, ...] = ("text_encoder",), **components: Any
) -> Any:
    """``pipeline_class(blocks=blocks)`` with ``blocks`` less the steps ``drop`` names (dotted paths into
    ``sub_blocks``: the text encoder step, whose outputs the calls pass), ``components`` set, every model in
    eval mode and no progress bar."""
    for path in drop:
        *parents, name = path.split(".")
        owner = blocks
        for parent in parents:
            owner = owner.sub_blocks[parent]
        owner.sub_blocks.pop(name)
    _quiet(blocks)
    pipe: Any = pipeline_class(blocks=blocks)
    pipe.update_components(**components)
    return eval_mode(pipe)


# ---------------------------------------------------------------------------------------------------------
# Wan 2.1 / 2.2 (WanBlocks, Wan22Blocks, WanImage2VideoAutoBlocks)
# ---------------------------------------------------------------------------------------------------------

_WAN_SIZE = 16
_WAN_FRAMES = 9


def _wan_transformer(seed: int = 0, **config: Any) -> WanTransformer3DModel:
    """The tiny Wan 2.1 transformer of :mod:`tests.pipelines.wan`, seeded with ``seed``."""
    return seeded(WanTransformer3DModel, {**WAN21_TRANSFORMER, **config}, seed=seed)


def _wan_kwargs(*, image: bool = False) -> MakeKwargs:
    """The 16×16, 9-frame kwargs of the modular Wan calls, with a 16×16 ``image`` if ``image``."""
    return call_kwargs(
        prompt_pair(WAN_TEXT_DIM),
        image=_WAN_SIZE if image else None,
        height=_WAN_SIZE,
        width=_WAN_SIZE,
        num_frames=_WAN_FRAMES,
    )


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def wan21_modular() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 text to video, ``WanBlocks`` in a ``WanModularPipeline`` (``tiny_wan21``, classifier-free
    guidance 5.0 from its guider): 16×16, 9 frames → ``videos`` [1, 9, 16, 16, 3]. One
    ``vae.decode(latents · latents_std + latents_mean, return_dict=False)`` of [1, 16, 3, 2, 2], then
    ``video_processor.postprocess_video``; ``output="latents"`` gives [1, 16, 3, 2, 2]."""
    pipe = _modular(
        WanModularPipeline,
        WanBlocks(),
        transformer=_wan_transformer(),
        vae=tiny_wan21(),
        scheduler=flow_unipc(3.0),
        guider=ClassifierFreeGuidance(guidance_scale=5.0),
    )
    return pipe, _wan_kwargs()


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def wan22_modular() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.2 A14B layout, text to video: ``Wan22Blocks`` in a ``Wan22ModularPipeline``, two transformers
    (seeds 0 and 1; ``transformer`` with guidance 4.0 while the timestep is at least ``boundary_ratio``
    0.875 · 1000, then ``transformer_2`` with guidance 3.0: with 2 steps, one step each) and the Wan 2.1
    VAE ``tiny_wan21``: 16×16, 9 frames → ``videos`` [1, 9, 16, 16, 3]. One ``vae.decode`` of
    [1, 16, 3, 2, 2] (as :func:`wan21_modular`); ``output="latents"`` gives [1, 16, 3, 2, 2]."""
    pipe = _modular(
        Wan22ModularPipeline,
        Wan22Blocks(),
        transformer=_wan_transformer(0),
        transformer_2=_wan_transformer(1),
        vae=tiny_wan21(),
        scheduler=flow_unipc(3.0),
        guider=ClassifierFreeGuidance(guidance_scale=4.0),
        guider_2=ClassifierFreeGuidance(guidance_scale=3.0),
    )
    return pipe, _wan_kwargs()


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def wan21_i2v_modular() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 image to video, ``WanImage2VideoAutoBlocks`` (its ``image2video`` workflow: ``image``
    without ``last_image``) in a ``WanImage2VideoModularPipeline``: a tiny CLIP vision tower (hidden states
    of size 4, the transformer's ``image_dim``), 36 transformer input channels (noise, mask, condition),
    ``tiny_wan21``. 16×16, 9 frames, a 16×16 image (resized to ``height`` × ``width``) → ``vae.encode`` of
    the image followed by 8 black frames, then one ``vae.decode`` of [1, 16, 3, 2, 2] → ``videos``
    [1, 9, 16, 16, 3]; ``output="latents"`` gives [1, 16, 3, 2, 2]."""
    pipe = _modular(
        WanImage2VideoModularPipeline,
        WanImage2VideoAutoBlocks(),
        transformer=_wan_transformer(in_channels=16 + 4 + 16, image_dim=CLIP_VISION["hidden_size"]),
        vae=tiny_wan21(),
        scheduler=flow_unipc(3.0),
        guider=ClassifierFreeGuidance(guidance_scale=5.0),
        image_encoder=seeded(CLIPVisionModel, {"config": CLIPVisionConfig(**CLIP_VISION)}),
        image_processor=CLIPImageProcessorPil(crop_size=_WAN_SIZE, size=_WAN_SIZE),
    )
    return pipe, _wan_kwargs(image=True)


# ---------------------------------------------------------------------------------------------------------
# Helios (HeliosAutoBlocks): autoregressive chunks, decoded one by one after the chunk loop
# ---------------------------------------------------------------------------------------------------------


# ``latents``: output "latents", the last chunk's (output "latent_chunks" is the list of both)
@builder(frames=(1, 65, 16, 16, 3), latents=(1, 16, 9, 2, 2))
def helios_modular() -> tuple[Pipeline, MakeKwargs]:
    """Helios text to video, ``HeliosAutoBlocks`` (its ``text2video`` workflow) in a
    ``HeliosModularPipeline`` with :mod:`tests.pipelines.helios`' tiny transformer and ``tiny_wan21``
    (classifier-free guidance 5.0 from its guider): 16×16, ``num_frames`` 66 → 2 autoregressive chunks of
    9 latent frames (33-frame windows). Unlike ``HeliosPipeline``, the chunk loop decodes nothing: the
    decode step then calls ``vae.decode`` once per chunk, [1, 16, 9, 2, 2] → 33 frames, twice, concatenates
    the 66 frames and cuts them to ``(n − 1) // 4 · 4 + 1`` = 65 → ``videos`` [1, 65, 16, 16, 3].
    ``output="latent_chunks"`` gives every chunk's latents, 2 × [1, 16, 9, 2, 2] (``"latents"`` only the
    last one's). ``num_frames`` 67 to 99 gives 3 chunks and 97 frames. The chunk loop's progress bar is a
    bare ``tqdm``, which no configuration turns off."""
    pipe = _modular(
        HeliosModularPipeline,
        HeliosAutoBlocks(),
        transformer=seeded(HeliosTransformer3DModel, HELIOS_TRANSFORMER),
        vae=tiny_wan21(),
        scheduler=HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True),
        guider=ClassifierFreeGuidance(guidance_scale=5.0),
    )
    prompt = prompt_pair(WAN_TEXT_DIM)
    return pipe, call_kwargs(prompt, height=16, width=16, num_frames=HELIOS_FRAMES)


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo 1.5 (HunyuanVideo15AutoBlocks)
# ---------------------------------------------------------------------------------------------------------


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2))
def hunyuan_video15_modular() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo 1.5 text to video, ``HunyuanVideo15AutoBlocks`` (its ``text2video`` workflow: no
    ``image``) in a ``HunyuanVideo15ModularPipeline`` with :mod:`tests.pipelines.hunyuan`'s tiny transformer
    and ``tiny_hunyuan_video15`` (classifier-free guidance 6.0 from its guider; the image embeddings are the
    blocks' own zeros, [1, 729, 12]): 16×16, 9 frames → ``videos`` [1, 9, 16, 16, 3]. One
    ``vae.decode(latents / scaling_factor, return_dict=False)`` of [1, 4, 3, 2, 2], then
    ``video_processor.postprocess_video``; ``output="latents"`` gives [1, 4, 3, 2, 2]."""
    pipe = _modular(HunyuanVideo15ModularPipeline, HunyuanVideo15AutoBlocks(), **hunyuan15_components())
    return pipe, call_kwargs(hunyuan15_prompt, height=16, width=16, num_frames=9)


# ---------------------------------------------------------------------------------------------------------
# LTX-2 (LTX2AutoBlocks): video and sound
# ---------------------------------------------------------------------------------------------------------


def _padding_tokenizer() -> PreTrainedTokenizerFast:
    """A one-word tokenizer that pads on the left, Gemma's side: the connector step reads only
    ``tokenizer.padding_side`` (how the prompt embeddings are padded), and there is no text encoder."""
    return word_tokenizer(["[UNK]"], padding_side="left")


def _ltx2_prompt() -> dict[str, Any]:
    """What LTX-2's text encoder step outputs: :func:`tests.pipelines.ltx.ltx2_prompt`'s embeddings
    [1, 16, 32·2] with all-ones masks (prompt and negative prompt), the prompt count and the embeddings'
    dtype."""
    return {**ltx2_prompt()(), "batch_size": 1, "dtype": torch.float32}


def _ltx2_modular(*, timestep_conditioning: bool) -> tuple[Pipeline, MakeKwargs]:
    pipe = _modular(
        LTX2ModularPipeline,
        LTX2AutoBlocks(),
        # the prompt enhancer (off unless ``enable_prompt_enhancement``) and the Gemma step; the text
        # conditioning step's connectors stay
        drop=("prompt_enhancer", "text_encoder.text_encoder"),
        **ltx2_components(timestep_conditioning=timestep_conditioning),
        tokenizer=_padding_tokenizer(),
        # classifier-free guidance only (as tests.pipelines.ltx's ltx2): no STG, no modality guidance
        guider=LTX2Guidance(guidance_scale=3.0),
        audio_guider=LTX2Guidance(guidance_scale=7.0),
    )
    decode = DECODE_NOISE if timestep_conditioning else {}
    return pipe, call_kwargs(_ltx2_prompt, height=32, width=32, num_frames=9, **decode)


# ``latents``: output "videos" with output_type="latent" (unpacked, de-normalized); the soundtrack is
# output "audio" at the vocoder's ``output_sampling_rate`` (its latents: output "audio", output_type="latent")
@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def ltx2_modular() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 text to video and sound, ``LTX2AutoBlocks`` (its ``text2video`` workflow; the prompt enhancer
    and the Gemma step dropped, the text connectors kept) in an ``LTX2ModularPipeline`` with
    :mod:`tests.pipelines.ltx`'s ltx2 models (``tiny_ltx2_video``): 32×32, 9 frames (given, so the duration
    head is skipped) → ``videos`` [1, 9, 32, 32, 3] and ``audio`` [1, 2, 5280] float32 at 16 kHz (the
    vocoder's ``output_sampling_rate``; the blocks have no sample-rate output).

    Call it ``pipe(**make_kwargs(), output_type="np", output=["videos", "audio"])``; the call also takes
    ``batch_size`` and ``dtype``, which the Gemma step would output. One ``vae.decode(latents, None,
    return_dict=False)`` of [1, 8, 2, 4, 4] (unpacked, de-normalized), then the audio VAE and the vocoder.
    ``output_type="latent"`` works here: ``videos`` [1, 8, 2, 4, 4], ``audio`` [1, 2, 9, 2]; output
    ``"latents"`` is the packed [1, 32, 8].
    """
    return _ltx2_modular(timestep_conditioning=False)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4), audio=LTX2_AUDIO)
def ltx2_timestep_modular() -> tuple[Pipeline, MakeKwargs]:
    """:func:`ltx2_modular` with :mod:`tests.pipelines.ltx`'s timestep-conditioned VAE: the decode step mixes
    noise from the call's generator into the normalized latents (``decode_noise_scale`` 0.025), then
    de-normalizes and calls ``vae.decode(latents, tensor([0.05]), return_dict=False)`` of [1, 8, 2, 4, 4];
    same shapes as ``ltx2_modular``."""
    return _ltx2_modular(timestep_conditioning=True)


# ---------------------------------------------------------------------------------------------------------
# Wan-Animate 2 (WanAnimate2Blocks): segments, one decode per segment inside the segment loop
# ---------------------------------------------------------------------------------------------------------

_ANIMATE2_SIZE = 16
#: diffusers' tiny Wan-Animate-2 transformer (its transformer model tests)
_ANIMATE2_TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "text_len": TEXT_TOKENS,
    "in_dim": 16 + 4 + 16,  # noise, i2v mask, condition latents
    "dim": 128,
    "ffn_dim": 256,
    "freq_dim": 64,
    "text_dim": WAN_TEXT_DIM,
    "out_dim": 16,
    "num_heads": 4,
    "num_layers": 2,
    "cross_attn_norm": True,
    "use_img_emb": True,
}
#: A CLIP vision tower the blocks can use: they resize every image to 224×224 (bicubic) and the
#: transformer's image projection is fixed at CLIP-H's width, 1280 (7×7 patches of 32 keep it small).
_ANIMATE2_CLIP: dict[str, Any] = {
    "hidden_size": 1280,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 224,
    "patch_size": 32,
}


def _animate2_prompt() -> dict[str, Any]:
    """What Wan-Animate-2's text encoder step outputs: prompt, negative-prompt and reference-prompt
    embeddings [1, 16, 32] (seeds 1, 2, 3)."""
    return {
        **prompt_pair(WAN_TEXT_DIM)(),
        "prompt_ref_embeds": randn(1, TEXT_TOKENS, WAN_TEXT_DIM, seed=3),
    }


def _driving_video(kwargs: dict[str, Any]) -> None:
    kwargs.setdefault("driving_video", noise_frames(kwargs.pop("num_frames"), _ANIMATE2_SIZE, seed=4))


def _animate2(pipeline_class: Any, blocks: Any, *, guidance_scale: float) -> tuple[Pipeline, MakeKwargs]:
    """A Wan-Animate-2 pipeline of ``blocks`` (the full or the distilled layout: the same models and call,
    classifier-free guidance at ``guidance_scale`` from its guider) and its call: a 16×16 character image, a
    17-frame 16×16 driving video, segments of 9 frames overlapping by 1."""
    pipe = _modular(
        pipeline_class,
        blocks,
        transformer=seeded(WanAnimate2Transformer3DModel, _ANIMATE2_TRANSFORMER),
        vae=tiny_wan21(),
        image_encoder=seeded(CLIPVisionModel, {"config": CLIPVisionConfig(**_ANIMATE2_CLIP)}),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        guider=ClassifierFreeGuidance(guidance_scale=guidance_scale),
    )
    make_kwargs = call_kwargs(
        _animate2_prompt,
        image=_ANIMATE2_SIZE,
        finish=_driving_video,
        height=_ANIMATE2_SIZE,
        width=_ANIMATE2_SIZE,
        segment_frame_length=9,
        prev_segment_conditioning_frames=1,
        num_frames=17,
    )
    return pipe, make_kwargs


# no latent output (the segment decode sets "latents" to None): ``latents`` is the shape each segment
# denoises, the reference image's slot and 3 latent frames
@builder(frames=(1, 17, 16, 16, 3), latents=(1, 16, 4, 2, 2))
def wan_animate2_modular() -> tuple[Pipeline, MakeKwargs]:
    """Wan-Animate-2 character animation, ``WanAnimate2Blocks`` in a ``WanAnimate2ModularPipeline``
    (diffusers' tiny transformer, a CLIP vision tower of width 1280, ``tiny_wan21``, classifier-free guidance
    3.0 from its guider): a 16×16 character image, a 17-frame 16×16 driving video, 16×16 (the image's aspect
    ratio: no letterbox), ``segment_frame_length`` 9, ``prev_segment_conditioning_frames`` 1 → 2 segments.

    Each segment ``vae.encode``s its 9 driving frames, denoises [1, 16, 1 + 3, 2, 2] (the first latent frame
    is the reference image's slot) and, inside the segment loop, drops that slot and decodes
    ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames; the second segment is conditioned on the first one's last
    decoded frame and drops its own first decoded frame. The decode step concatenates 9 + 8 frames, cuts
    them to the driving video's length (17; a length that is not ``1 + 8k`` is zigzag-padded to the next
    one, then cut back) and crops the letterbox bars (none here: an image of another aspect ratio than the
    resolved frame's is letterboxed, and the video cropped back) → ``videos`` [1, 17, 16, 16, 3]. No latent
    output (``output="segment_frames"`` gives the decoded segments, [1, 3, 9, 16, 16] and [1, 3, 8, 16, 16]).

    The first call in a process compiles the flex-attention block mask (``create_block_mask(...,
    _compile=True)``, inductor on the CPU): about 2.5 minutes with an empty inductor cache, 10–15 s with a
    warm one; later calls take about 1 s.

    ``num_frames`` sets the driving video's length (not a blocks input); ``prev_segment_conditioning_frames``
    is always in the kwargs (streamvae reads it from them: a modular pipeline has no signature defaults).
    The segment loop's progress bar is a bare ``tqdm``, which no configuration turns off.
    """
    return _animate2(WanAnimate2ModularPipeline, WanAnimate2Blocks(), guidance_scale=3.0)


# ---------------------------------------------------------------------------------------------------------
# MiniMax-H3 (MiniMaxH3Blocks): video and sound
# ---------------------------------------------------------------------------------------------------------

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
    "text_dim": 8,  # the prompt embeddings' width
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
        "prompt_embeds": randn(1, TEXT_TOKENS, _MINIMAX_TRANSFORMER["text_dim"], seed=1),
        "text_token_tags": torch.full((TEXT_TOKENS,), MINIMAX_H3_TEXT_TAG, dtype=torch.long),
    }


# no output_type="latent": ``frames`` is output "videos" (output_type="np"), ``latents`` output "latents";
# the soundtrack is output "audio" at output "sampling_rate", its latents output "audio_latents"
@builder(
    frames=(1, 124, 16, 16, 3),
    latents=(1, 4, 37, 4, 4),
    audio=ExpectedAudio(shape=(1, 2, 828), sample_rate=160, latents=(2, 8, 207)),
)
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
    pipe = _modular(
        MiniMaxH3ModularPipeline,
        MiniMaxH3Blocks(),
        transformer=seeded(MiniMaxH3Transformer3DModel, _MINIMAX_TRANSFORMER),
        vae=tiny_minimax_h3(),
        audio_vae=seeded(AutoencoderKLMiniMaxH3Audio, _MINIMAX_AUDIO_VAE),
        scheduler=MiniMaxH3Scheduler(shift=12.0),
        audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
    )
    return pipe, call_kwargs(_minimax_prompt, height=16, width=16, num_frames=124)


# ---------------------------------------------------------------------------------------------------------
# Wan 2.2 A14B image to video and VACE (Wan22Image2VideoBlocks, Wan22VaceBlocks): one decode after the loop
# ---------------------------------------------------------------------------------------------------------


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def wan22_i2v_modular() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.2 A14B image to video, ``Wan22Image2VideoBlocks`` in a ``Wan22Image2VideoModularPipeline``: two
    transformers taking the noise, the first-frame mask and the condition latents (16 + 4 + 16 channels, no
    image encoder; seeds 0 and 1, guidance 4.0 then 3.0 across ``boundary_ratio`` 0.875, as
    :func:`wan22_modular`) and ``tiny_wan21``. 16×16, 9 frames, a 16×16 image → ``vae.encode`` of the image
    followed by 8 black frames, then one ``vae.decode`` of [1, 16, 3, 2, 2] → ``videos``
    [1, 9, 16, 16, 3]; ``output="latents"`` gives [1, 16, 3, 2, 2]."""
    channels = {"in_channels": 16 + 4 + 16}
    pipe = _modular(
        Wan22Image2VideoModularPipeline,
        Wan22Image2VideoBlocks(),
        transformer=_wan_transformer(0, **channels),
        transformer_2=_wan_transformer(1, **channels),
        vae=tiny_wan21(),
        scheduler=flow_unipc(3.0),
        guider=ClassifierFreeGuidance(guidance_scale=4.0),
        guider_2=ClassifierFreeGuidance(guidance_scale=3.0),
    )
    return pipe, _wan_kwargs(image=True)


# ``latents``: output "latents", the reference frame trimmed off
@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def wan22_vace_modular() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.2 VACE, ``Wan22VaceBlocks`` in a ``Wan22VaceModularPipeline``: two of
    :mod:`tests.pipelines.wan`'s tiny VACE transformers (seeds 0 and 1, guidance 4.0 then 3.0 across
    ``boundary_ratio`` 0.875) and ``tiny_wan21``; :func:`tests.pipelines.wan.wan_vace`'s inputs: a 9-frame
    16×16 noise video with its right half masked to be generated and one reference image. The reference
    takes a latent frame in front while denoising ([1, 16, 1 + 3, 2, 2]); a step trims it off before the
    one ``vae.decode`` of [1, 16, 3, 2, 2] → ``videos`` [1, 9, 16, 16, 3]."""
    pipe = _modular(
        Wan22VaceModularPipeline,
        Wan22VaceBlocks(),
        transformer=seeded(WanVACETransformer3DModel, _VACE_TRANSFORMER, seed=0),
        transformer_2=seeded(WanVACETransformer3DModel, _VACE_TRANSFORMER, seed=1),
        vae=tiny_wan21(),
        scheduler=flow_unipc(3.0),
        guider=ClassifierFreeGuidance(guidance_scale=4.0),
        guider_2=ClassifierFreeGuidance(guidance_scale=3.0),
    )
    size = {"height": _WAN_SIZE, "width": _WAN_SIZE, "num_frames": _WAN_FRAMES}
    return pipe, call_kwargs(prompt_pair(WAN_TEXT_DIM), finish=_vace_inputs, **size)


# ---------------------------------------------------------------------------------------------------------
# Helios pyramid (HeliosPyramidAutoBlocks, HeliosPyramidDistilledAutoBlocks): chunks, decoded after the loop
# ---------------------------------------------------------------------------------------------------------

#: 2 pyramid stages (latents 2×2, then 4×4) of 1 step each. ``gamma`` 0.3, not the default 1/3: the block
#: noise of an upsampling stage has the covariance ``(1+γ)I − γJ`` over 2×2 patches, singular at γ = 1/3,
#: which CPU LAPACK's Cholesky rejects in float32 (as :func:`tests.pipelines.helios.helios_pyramid`).
_PYRAMID_STAGES: dict[str, Any] = {"stage_range": [0, 0.5, 1], "stages": 2, "gamma": 0.3}


def _helios_pyramid(
    pipeline_class: Any, blocks: Any, scheduler: Any, guider: Any
) -> tuple[Pipeline, MakeKwargs]:
    """A Helios pyramid pipeline of ``blocks`` (the full or the distilled layout: the tiny transformer of
    :mod:`tests.pipelines.helios` and ``tiny_wan21``, with ``scheduler`` and ``guider``) and its call:
    32×32, ``num_frames`` 66 (2 chunks), one step a stage (``pyramid_num_inference_steps_list``; the blocks
    take no ``num_inference_steps``)."""
    pipe = _modular(
        pipeline_class,
        blocks,
        transformer=seeded(HeliosTransformer3DModel, HELIOS_TRANSFORMER),
        vae=tiny_wan21(),
        scheduler=scheduler,
        guider=guider,
    )

    def no_steps(kwargs: dict[str, Any]) -> None:
        kwargs.pop("num_inference_steps", None)

    return pipe, call_kwargs(
        prompt_pair(WAN_TEXT_DIM),
        finish=no_steps,
        height=32,
        width=32,
        num_frames=HELIOS_FRAMES,
        pyramid_num_inference_steps_list=[1, 1],
    )


# ``latents``: output "latents", the last chunk's (output "latent_chunks" is the list of both)
@builder(frames=(1, 65, 32, 32, 3), latents=(1, 16, 9, 4, 4))
def helios_pyramid_modular() -> tuple[Pipeline, MakeKwargs]:
    """Helios pyramid text to video, ``HeliosPyramidAutoBlocks`` (its ``text2video`` workflow) in a
    ``HeliosPyramidModularPipeline`` with :mod:`tests.pipelines.helios`' tiny transformer, ``tiny_wan21``
    and the classifier-free zero-star guider its denoise step expects (guidance 5.0; its zero init, the
    first step's prediction zeroed, in stage 0 only): 32×32, ``num_frames`` 66 → 2 autoregressive chunks of
    9 latent frames, each denoised in 2 pyramid stages of 1 step (2×2 latents, upsampled to 4×4 with block
    noise). As in :func:`helios_modular`, the chunk loop decodes nothing: the decode step calls
    ``vae.decode`` once per chunk, [1, 16, 9, 4, 4] → 33 frames, twice, and cuts the 66 frames to 65 →
    ``videos`` [1, 65, 32, 32, 3]. The chunk loop's progress bar is a bare ``tqdm``."""
    scheduler = HeliosScheduler(**_PYRAMID_STAGES, use_dynamic_shifting=True)
    guider = ClassifierFreeZeroStarGuidance(guidance_scale=5.0)
    return _helios_pyramid(HeliosPyramidModularPipeline, HeliosPyramidAutoBlocks(), scheduler, guider)


@builder(frames=(1, 65, 32, 32, 3), latents=(1, 16, 9, 4, 4))
def helios_pyramid_distilled_modular() -> tuple[Pipeline, MakeKwargs]:
    """Helios pyramid, distilled: ``HeliosPyramidDistilledAutoBlocks`` (``text2video``) in a
    ``HeliosPyramidDistilledModularPipeline``, :func:`helios_pyramid_modular`'s models and call with the
    DMD scheduler (``HeliosDMDScheduler``, whose step re-noises from the stage's start point with the
    call's generator) and no guidance (the guider's scale 1.0: one transformer pass a step). Same decode:
    ``vae.decode`` of [1, 16, 9, 4, 4] once per chunk after the loop, 66 frames cut to 65 → ``videos``
    [1, 65, 32, 32, 3]."""
    scheduler = HeliosDMDScheduler(**_PYRAMID_STAGES, use_dynamic_shifting=True)
    guider = ClassifierFreeGuidance(guidance_scale=1.0)
    return _helios_pyramid(
        HeliosPyramidDistilledModularPipeline, HeliosPyramidDistilledAutoBlocks(), scheduler, guider
    )


# ---------------------------------------------------------------------------------------------------------
# Wan-Animate 2, distilled (WanAnimate2DistilledBlocks): segments, one decode per segment inside the loop
# ---------------------------------------------------------------------------------------------------------


@builder(frames=(1, 17, 16, 16, 3), latents=(1, 16, 4, 2, 2))
def wan_animate2_distilled_modular() -> tuple[Pipeline, MakeKwargs]:
    """Wan-Animate-2's distilled checkpoint layout, ``WanAnimate2DistilledBlocks`` in a
    ``WanAnimate2DistilledModularPipeline``: :func:`wan_animate2_modular`'s models and call, sampled without
    classifier-free guidance (the guider's scale 1.0: one transformer pass a step) in 2 steps. Its segment
    loop and decode step are :func:`wan_animate2_modular`'s: 2 segments of 9 frames, each ``vae.decode`` of
    [1, 16, 3, 2, 2] inside the loop, the second dropping its first decoded frame, cut to the driving
    video's 17 frames and cropped to the image's region (all of it here: a square image in a square frame,
    no letterbox) → ``videos`` [1, 17, 16, 16, 3]. The first call in a process compiles the flex-attention
    block mask, as :func:`wan_animate2_modular`'s does."""
    return _animate2(WanAnimate2DistilledModularPipeline, WanAnimate2DistilledBlocks(), guidance_scale=1.0)
