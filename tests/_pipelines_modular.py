"""Tiny seeded diffusers modular video pipelines: Wan, Helios, HunyuanVideo 1.5, LTX-2, Wan-Animate-2.

The same contract as :mod:`tests._pipelines` (read it first) and :mod:`tests._pipelines_more`'s
``minimax_h3_modular``: each builder in :data:`BUILDERS` returns ``(pipe, make_kwargs)``, is built once per
process (do not mutate what it returns), and draws from a fresh ``torch.Generator().manual_seed(0)`` every
call, so two calls give the same frames.

Each pipe is a ``ModularPipeline`` around diffusers' own blocks class less its text encoder step: the
call passes what that step outputs (``prompt_embeds``, ``negative_prompt_embeds``, ...). The models are
set with ``update_components`` (seeded, eval mode) and the progress bars the blocks let one configure are
off (Helios's and Wan-Animate-2's loops use a bare ``tqdm``). A modular pipeline is called
``pipe(**make_kwargs(), output_type="np", output=["videos"])`` and returns a dict of those outputs; there
is no ``guidance_scale`` argument (each pipe's guider component sets it) and, but for LTX-2, no
``output_type="latent"``: ``output="latents"`` gives the denoised latents.

- ``wan21_modular`` / ``wan22_modular`` / ``wan21_i2v_modular``: ``WanBlocks``, ``Wan22Blocks`` (two
  transformers), ``WanImage2VideoAutoBlocks``; one decode after the loop.
- ``hunyuan_video15_modular``: ``HunyuanVideo15AutoBlocks``, text to video; one decode.
- ``helios_modular``: ``HeliosAutoBlocks``; one decode per chunk, all after the chunk loop.
- ``ltx2_modular`` / ``ltx2_timestep_modular``: ``LTX2AutoBlocks``, video and a stereo soundtrack
  (:data:`AUDIO`); one decode.
- ``wan_animate2_modular``: ``WanAnimate2Blocks``; one decode per segment, inside the segment loop.

:data:`EXPECTED` gives the shapes of the default kwargs: ``frames`` is output ``"videos"`` with
``output_type="np"``, ``latents`` the blocks' latent output (see each entry).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    ClassifierFreeGuidance,
    FlowMatchEulerDiscreteScheduler,
    HeliosAutoBlocks,
    HeliosModularPipeline,
    HeliosScheduler,
    HeliosTransformer3DModel,
    HunyuanVideo15AutoBlocks,
    HunyuanVideo15ModularPipeline,
    HunyuanVideo15Transformer3DModel,
    LTX2AutoBlocks,
    LTX2Guidance,
    LTX2ModularPipeline,
    LTX2VideoTransformer3DModel,
    UniPCMultistepScheduler,
    Wan22Blocks,
    Wan22ModularPipeline,
    WanAnimate2Blocks,
    WanAnimate2ModularPipeline,
    WanAnimate2Transformer3DModel,
    WanBlocks,
    WanImage2VideoAutoBlocks,
    WanImage2VideoModularPipeline,
    WanModularPipeline,
    WanTransformer3DModel,
)
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModel, PreTrainedTokenizerFast

from tests._pipelines import (
    _CLIP_VISION,
    _TEXT_TOKENS,
    _WAN_TRANSFORMER,
    Builder,
    Expected,
    MakeKwargs,
    Pipeline,
    Prompt,
    _image,
    _prompt_pair,
    _randn,
    _seeded,
)
from tests._pipelines_clips import _HELIOS_FRAMES, _HELIOS_TRANSFORMER, _frames
from tests._pipelines_more import (
    _HUNYUAN15_TRANSFORMER,
    _LTX2_AUDIO_VAE,
    _LTX2_CAPTION,
    _LTX2_CONNECTORS,
    _LTX2_SAMPLE_RATE,
    _LTX2_TEXT_LAYERS,
    _LTX2_TRANSFORMER,
    _LTX2_VOCODER,
    ExpectedAudio,
    _call_kwargs,
    _eval,
    _hunyuan15_prompt,
    _ltx2_timestep_vae,
    _quiet,
)
from tests._vaes import tiny_hunyuan_video15, tiny_ltx2_video, tiny_wan21

__all__ = ["AUDIO", "BUILDERS", "EXPECTED"]


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
    return _eval(pipe)


def _image_kwargs(prompt: Prompt, size: int, **fixed: Any) -> MakeKwargs:
    """:func:`tests._pipelines_more._call_kwargs` with a seeded ``size`` × ``size`` noise ``image`` (a new
    object every call)."""
    base = _call_kwargs(prompt, **fixed)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        return {"image": _image(size), **base(**overrides)}

    return make_kwargs


# ---------------------------------------------------------------------------------------------------------
# Wan 2.1 / 2.2 (WanBlocks, Wan22Blocks, WanImage2VideoAutoBlocks)
# ---------------------------------------------------------------------------------------------------------

_WAN_TEXT_DIM = 32
_WAN_CHANNELS = {"in_channels": 16, "out_channels": 16}
#: the Wan 2.1 / 2.2 A14B scheduler of tests._pipelines' Wan 2.2 (flow-matching UniPC)
_WAN_SCHEDULER: dict[str, Any] = {
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
}
_WAN_SIZE = 16
_WAN_FRAMES = 9


def _wan_transformer(seed: int = 0, **config: Any) -> WanTransformer3DModel:
    """tests._pipelines' tiny Wan transformer with 16 latent channels, seeded with ``seed``."""
    torch.manual_seed(seed)
    return WanTransformer3DModel(**{**_WAN_TRANSFORMER, **_WAN_CHANNELS, **config})


def _wan_kwargs() -> MakeKwargs:
    return _call_kwargs(
        _prompt_pair(_WAN_TEXT_DIM), height=_WAN_SIZE, width=_WAN_SIZE, num_frames=_WAN_FRAMES
    )


@functools.cache
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
        scheduler=UniPCMultistepScheduler(**_WAN_SCHEDULER),
        guider=ClassifierFreeGuidance(guidance_scale=5.0),
    )
    return pipe, _wan_kwargs()


@functools.cache
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
        scheduler=UniPCMultistepScheduler(**_WAN_SCHEDULER),
        guider=ClassifierFreeGuidance(guidance_scale=4.0),
        guider_2=ClassifierFreeGuidance(guidance_scale=3.0),
    )
    return pipe, _wan_kwargs()


@functools.cache
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
        transformer=_wan_transformer(in_channels=16 + 4 + 16, image_dim=_CLIP_VISION["hidden_size"]),
        vae=tiny_wan21(),
        scheduler=UniPCMultistepScheduler(**_WAN_SCHEDULER),
        guider=ClassifierFreeGuidance(guidance_scale=5.0),
        image_encoder=_seeded(CLIPVisionModel, {"config": CLIPVisionConfig(**_CLIP_VISION)}),
        image_processor=CLIPImageProcessorPil(crop_size=_WAN_SIZE, size=_WAN_SIZE),
    )
    prompt = _prompt_pair(_WAN_TEXT_DIM)
    return pipe, _image_kwargs(prompt, _WAN_SIZE, height=_WAN_SIZE, width=_WAN_SIZE, num_frames=_WAN_FRAMES)


# ---------------------------------------------------------------------------------------------------------
# Helios (HeliosAutoBlocks): autoregressive chunks, decoded one by one after the chunk loop
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def helios_modular() -> tuple[Pipeline, MakeKwargs]:
    """Helios text to video, ``HeliosAutoBlocks`` (its ``text2video`` workflow) in a
    ``HeliosModularPipeline`` with tests._pipelines_clips' tiny Helios transformer and ``tiny_wan21``
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
        transformer=_seeded(HeliosTransformer3DModel, _HELIOS_TRANSFORMER),
        vae=tiny_wan21(),
        scheduler=HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True),
        guider=ClassifierFreeGuidance(guidance_scale=5.0),
    )
    prompt = _prompt_pair(_WAN_TEXT_DIM)
    return pipe, _call_kwargs(prompt, height=16, width=16, num_frames=_HELIOS_FRAMES)


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo 1.5 (HunyuanVideo15AutoBlocks)
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def hunyuan_video15_modular() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo 1.5 text to video, ``HunyuanVideo15AutoBlocks`` (its ``text2video`` workflow: no
    ``image``) in a ``HunyuanVideo15ModularPipeline`` with tests._pipelines_more's tiny transformer and
    ``tiny_hunyuan_video15`` (classifier-free guidance 6.0 from its guider; the image embeddings are the
    blocks' own zeros, [1, 729, 12]): 16×16, 9 frames → ``videos`` [1, 9, 16, 16, 3]. One
    ``vae.decode(latents / scaling_factor, return_dict=False)`` of [1, 4, 3, 2, 2], then
    ``video_processor.postprocess_video``; ``output="latents"`` gives [1, 4, 3, 2, 2]."""
    pipe = _modular(
        HunyuanVideo15ModularPipeline,
        HunyuanVideo15AutoBlocks(),
        transformer=_seeded(HunyuanVideo15Transformer3DModel, _HUNYUAN15_TRANSFORMER),
        vae=tiny_hunyuan_video15(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )
    return pipe, _call_kwargs(_hunyuan15_prompt, height=16, width=16, num_frames=9)


# ---------------------------------------------------------------------------------------------------------
# LTX-2 (LTX2AutoBlocks): video and sound
# ---------------------------------------------------------------------------------------------------------


def _padding_tokenizer() -> PreTrainedTokenizerFast:
    """A one-word tokenizer that pads on the left, Gemma's side: the connector step reads only
    ``tokenizer.padding_side`` (how the prompt embeddings are padded), and there is no text encoder."""
    vocabulary = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=vocabulary, padding_side="left")


def _ltx2_prompt() -> dict[str, Any]:
    """What LTX-2's text encoder step outputs: tests._pipelines_more's prompt embeddings [1, 16, 32·2] with
    all-ones masks (prompt and negative prompt), the prompt count and the embeddings' dtype."""
    prompt = _prompt_pair(_LTX2_CAPTION * _LTX2_TEXT_LAYERS, mask_dtype=torch.long)
    return {**prompt(), "batch_size": 1, "dtype": torch.float32}


@functools.cache  # each variant is built once per process
def _ltx2_modular(*, timestep_conditioning: bool) -> tuple[Pipeline, MakeKwargs]:
    pipe = _modular(
        LTX2ModularPipeline,
        LTX2AutoBlocks(),
        # the prompt enhancer (off unless ``enable_prompt_enhancement``) and the Gemma step; the text
        # conditioning step's connectors stay
        drop=("prompt_enhancer", "text_encoder.text_encoder"),
        transformer=_seeded(LTX2VideoTransformer3DModel, _LTX2_TRANSFORMER),
        connectors=_seeded(LTX2TextConnectors, _LTX2_CONNECTORS),
        tokenizer=_padding_tokenizer(),
        vae=_ltx2_timestep_vae() if timestep_conditioning else tiny_ltx2_video(),
        audio_vae=_seeded(AutoencoderKLLTX2Audio, _LTX2_AUDIO_VAE),
        vocoder=_seeded(LTX2Vocoder, _LTX2_VOCODER),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        # classifier-free guidance only (as tests._pipelines_more's ltx2): no STG, no modality guidance
        guider=LTX2Guidance(guidance_scale=3.0),
        audio_guider=LTX2Guidance(guidance_scale=7.0),
    )
    decode: dict[str, Any] = (
        {"decode_timestep": 0.05, "decode_noise_scale": 0.025} if timestep_conditioning else {}
    )
    return pipe, _call_kwargs(_ltx2_prompt, height=32, width=32, num_frames=9, **decode)


def ltx2_modular() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 text to video and sound, ``LTX2AutoBlocks`` (its ``text2video`` workflow; the prompt enhancer
    and the Gemma step dropped, the text connectors kept) in an ``LTX2ModularPipeline`` with
    tests._pipelines_more's ltx2 models (``tiny_ltx2_video``): 32×32, 9 frames (given, so the duration head
    is skipped) → ``videos`` [1, 9, 32, 32, 3] and ``audio`` [1, 2, 5280] float32 at 16 kHz (the vocoder's
    ``output_sampling_rate``; the blocks have no sample-rate output).

    Call it ``pipe(**make_kwargs(), output_type="np", output=["videos", "audio"])``; the call also takes
    ``batch_size`` and ``dtype``, which the Gemma step would output. One ``vae.decode(latents, None,
    return_dict=False)`` of [1, 8, 2, 4, 4] (unpacked, de-normalized), then the audio VAE and the vocoder.
    ``output_type="latent"`` works here: ``videos`` [1, 8, 2, 4, 4], ``audio`` [1, 2, 9, 2]; output
    ``"latents"`` is the packed [1, 32, 8].
    """
    return _ltx2_modular(timestep_conditioning=False)


def ltx2_timestep_modular() -> tuple[Pipeline, MakeKwargs]:
    """:func:`ltx2_modular` with tests._pipelines_more's timestep-conditioned VAE: the decode step mixes
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
    "text_len": _TEXT_TOKENS,
    "in_dim": 16 + 4 + 16,  # noise, i2v mask, condition latents
    "dim": 128,
    "ffn_dim": 256,
    "freq_dim": 64,
    "text_dim": _WAN_TEXT_DIM,
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
        **_prompt_pair(_WAN_TEXT_DIM)(),
        "prompt_ref_embeds": _randn(1, _TEXT_TOKENS, _WAN_TEXT_DIM, seed=3),
    }


@functools.cache
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
    pipe = _modular(
        WanAnimate2ModularPipeline,
        WanAnimate2Blocks(),
        transformer=_seeded(WanAnimate2Transformer3DModel, _ANIMATE2_TRANSFORMER),
        vae=tiny_wan21(),
        image_encoder=_seeded(CLIPVisionModel, {"config": CLIPVisionConfig(**_ANIMATE2_CLIP)}),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        guider=ClassifierFreeGuidance(guidance_scale=3.0),
    )
    fixed = {"segment_frame_length": 9, "prev_segment_conditioning_frames": 1, "num_frames": 17}
    base = _image_kwargs(
        _animate2_prompt, _ANIMATE2_SIZE, height=_ANIMATE2_SIZE, width=_ANIMATE2_SIZE, **fixed
    )

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        frames = kwargs.pop("num_frames")
        kwargs.setdefault("driving_video", _frames(frames, _ANIMATE2_SIZE, seed=4))
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# Index
# ---------------------------------------------------------------------------------------------------------

#: Builder name → builder; each builds its pipeline once per process (do not mutate what it returns).
BUILDERS: dict[str, Builder] = {
    "wan21_modular": wan21_modular,
    "wan22_modular": wan22_modular,
    "wan21_i2v_modular": wan21_i2v_modular,
    "hunyuan_video15_modular": hunyuan_video15_modular,
    "helios_modular": helios_modular,
    "ltx2_modular": ltx2_modular,
    "ltx2_timestep_modular": ltx2_timestep_modular,
    "wan_animate2_modular": wan_animate2_modular,
}

_WAN = Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
_LTX2 = Expected(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4))

#: Builder name → output shapes with the builder's default kwargs (``latents``: output "latents").
EXPECTED: dict[str, Expected] = {
    "wan21_modular": _WAN,
    "wan22_modular": _WAN,
    "wan21_i2v_modular": _WAN,
    "hunyuan_video15_modular": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2)),
    # ``latents``: output "latents", the last chunk's (output "latent_chunks" is the list of both)
    "helios_modular": Expected(frames=(1, 65, 16, 16, 3), latents=(1, 16, 9, 2, 2)),
    # ``latents``: output "videos" with output_type="latent" (unpacked, de-normalized)
    "ltx2_modular": _LTX2,
    "ltx2_timestep_modular": _LTX2,
    # no latent output (the segment decode sets "latents" to None): ``latents`` is the shape each segment
    # denoises, the reference image's slot and 3 latent frames
    "wan_animate2_modular": Expected(frames=(1, 17, 16, 16, 3), latents=(1, 16, 4, 2, 2)),
}

_LTX2_AUDIO = ExpectedAudio(shape=(1, 2, 5280), sample_rate=_LTX2_SAMPLE_RATE, latents=(1, 2, 9, 2))

#: Builder name → its soundtrack with the builder's default kwargs: output "audio" at the vocoder's
#: ``output_sampling_rate`` (``latents``: output "audio" with output_type="latent").
AUDIO: dict[str, ExpectedAudio] = {
    "ltx2_modular": _LTX2_AUDIO,
    "ltx2_timestep_modular": _LTX2_AUDIO,
}
