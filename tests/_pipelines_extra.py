"""Yet more tiny seeded diffusers video pipelines: image-, video- and control-conditioned variants.

The same contract as :mod:`tests._pipelines` (whose helpers this module reuses): each builder in
:data:`BUILDERS` returns ``(pipe, make_kwargs)``, ``pipe(**make_kwargs(), output_type="np")`` runs 2 inference
steps on a few tiny frames from prompt embeddings (no text encoder, no tokenizer) with a fresh
``torch.Generator().manual_seed(0)`` every call, and ``make_kwargs(**overrides)`` replaces or adds keys. A
pipeline is built once per process (``functools.cache``): do not mutate the cached pipe or its components.

How they reach the VAE (checked against ``generate_mp4`` with a plain ``PipelinePlan(name)``: decode once
after the loop, keep every frame):

* one ``vae.decode`` of the latents after the loop, every decoded frame kept (exact with the plain plan):
  ``wan_vace``, ``wan_v2v``, ``skyreels_v2``, ``skyreels_v2_i2v``, ``skyreels_v2_df_i2v``,
  ``hunyuan_video_i2v_token_replace``, ``hunyuan_skyreels_i2v``, ``hunyuan_video15_i2v``, ``cogvideox_i2v``,
  ``cogvideox15_i2v``, ``cogvideox_v2v``, ``cogvideox_fun_control``, ``consisid``, ``easyanimate``,
  ``kandinsky5_i2v``, ``chronoedit``, ``lucy_edit``, ``motif_video``, ``anyflow``; and ``ltx2_i2v``, which
  then decodes its sound as ``LTX2Pipeline`` does (:data:`AUDIO`).
* one decode, but not every frame of it as the video: ``hunyuan_video_i2v`` ("latent_concat") drops the
  first 4 decoded frames; ``skyreels_v2_df_v2v`` puts the input video's own frames before the decoded ones.
* ``stable_video_diffusion`` decodes frames as a 2D batch (``[B·F, C, h, w]``, ``num_frames=``), in
  ``decode_chunk_size`` chunks.

:data:`EXPECTED` gives, for the default kwargs, the shape of ``.frames`` with ``output_type="np"``
(``[batch, frames, height, width, 3]``) and with ``output_type="latent"`` (each pipeline's own layout).
``consisid`` is in :data:`BUILDERS` only where OpenCV (``cv2``) is installed: without it diffusers'
``ConsisIDPipeline`` is a placeholder that raises.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AdaptiveProjectedGuidance,
    AnyFlowPipeline,
    AnyFlowTransformer3DModel,
    AutoencoderKLLTX2Audio,
    ChronoEditPipeline,
    ChronoEditTransformer3DModel,
    ClassifierFreeGuidance,
    CogVideoXDDIMScheduler,
    CogVideoXFunControlPipeline,
    CogVideoXImageToVideoPipeline,
    CogVideoXTransformer3DModel,
    CogVideoXVideoToVideoPipeline,
    ConsisIDPipeline,
    ConsisIDTransformer3DModel,
    EasyAnimatePipeline,
    EasyAnimateTransformer3DModel,
    EulerDiscreteScheduler,
    FlowMapEulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HunyuanSkyreelsImageToVideoPipeline,
    HunyuanVideo15ImageToVideoPipeline,
    HunyuanVideo15Transformer3DModel,
    HunyuanVideoImageToVideoPipeline,
    HunyuanVideoTransformer3DModel,
    Kandinsky5I2VPipeline,
    Kandinsky5Transformer3DModel,
    LTX2ImageToVideoPipeline,
    LTX2VideoTransformer3DModel,
    LucyEditPipeline,
    MotifVideoPipeline,
    MotifVideoTransformer3DModel,
    SkyReelsV2DiffusionForcingImageToVideoPipeline,
    SkyReelsV2DiffusionForcingVideoToVideoPipeline,
    SkyReelsV2ImageToVideoPipeline,
    SkyReelsV2Pipeline,
    SkyReelsV2Transformer3DModel,
    StableVideoDiffusionPipeline,
    UNetSpatioTemporalConditionModel,
    UniPCMultistepScheduler,
    WanTransformer3DModel,
    WanVACEPipeline,
    WanVACETransformer3DModel,
    WanVideoToVideoPipeline,
)
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    CLIPVisionModelWithProjection,
    SiglipImageProcessorPil,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from tests._pipelines import (
    _CLIP_VISION,
    _COG_TEXT_DIM,
    _COG_TRANSFORMER,
    _HUNYUAN_TRANSFORMER,
    _TEXT_TOKENS,
    _WAN_TRANSFORMER,
    Builder,
    Expected,
    MakeKwargs,
    Pipeline,
    _image,
    _pipeline,
    _prompt_pair,
    _randn,
    _seeded,
    _video_kwargs,
)
from tests._pipelines_clips import (
    _KANDINSKY_TRANSFORMER,
    _SKYREELS_TRANSFORMER,
    _frames,
    _kandinsky_prompt,
    _skyreels_kwargs,
)
from tests._pipelines_more import (
    _HUNYUAN15_TRANSFORMER,
    _LTX2_AUDIO_VAE,
    _LTX2_CAPTION,
    _LTX2_CONNECTORS,
    _LTX2_GUIDANCE,
    _LTX2_SAMPLE_RATE,
    _LTX2_TEXT_LAYERS,
    _LTX2_TRANSFORMER,
    _LTX2_VOCODER,
    _SIGLIP_VISION,
    ExpectedAudio,
    _call_kwargs,
    _hunyuan15_prompt,
)
from tests._vaes import (
    tiny_cogvideox,
    tiny_hunyuan_video,
    tiny_hunyuan_video15,
    tiny_ltx2_video,
    tiny_magvit,
    tiny_stable_video,
    tiny_wan21,
    tiny_wan22,
)

__all__ = ["AUDIO", "BUILDERS", "EXPECTED"]

_WAN_TEXT_DIM = 32  # the text_dim of every Wan-style transformer below (diffusers' tests)


def _masks(count: int, size: int) -> list[PIL.Image.Image]:
    """``count`` "L" masks ``size`` × ``size``: the left half kept (0), the right half generated (255)."""
    pixels = np.zeros((size, size), dtype=np.uint8)
    pixels[:, size // 2 :] = 255
    return [PIL.Image.fromarray(pixels, mode="L") for _ in range(count)]


# ---------------------------------------------------------------------------------------------------------
# Wan 2.1: VACE, video to video
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tiny VACE transformer (tests/pipelines/wan/test_wan_vace.py): 3 blocks, VACE blocks at 0 and 2;
#: the VACE input is the inactive and reactive video latents (16 + 16) and the 8×8 mask patches (64).
_VACE_TRANSFORMER: dict[str, Any] = {
    **_WAN_TRANSFORMER,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 3,
    "vace_layers": [0, 2],
    "vace_in_channels": 96,
}


@functools.cache
def wan_vace() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 VACE (``tiny_wan21``): a 9-frame 16×16 noise video, its right half masked to be generated,
    and one reference image. The reference takes a latent frame in front: the denoised latents are
    [1, 16, 1 + 3, 2, 2] (the ``"latent"`` output), and the pipeline drops the reference's frame before its
    one ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames (``vae.encode`` runs first, on the video and the
    reference). ``reference_images=None`` gives latents [1, 16, 3, 2, 2]. About 0.15 s a call on 2 CPU cores;
    no audio.
    """
    pipe = _pipeline(
        WanVACEPipeline,
        vae=tiny_wan21(),
        transformer=_seeded(WanVACETransformer3DModel, _VACE_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    base = _video_kwargs(16, 6.0, _prompt_pair(_WAN_TEXT_DIM))

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        frames = kwargs["num_frames"]
        kwargs.setdefault("video", _frames(frames, 16, seed=3))
        kwargs.setdefault("mask", _masks(frames, 16))
        kwargs.setdefault("reference_images", _frames(1, 16, seed=4)[0])
        return kwargs

    return pipe, make_kwargs


@functools.cache
def wan_v2v() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 video to video (``tiny_wan21``): a 9-frame 16×16 noise video, encoded, noised to
    ``strength`` 0.8 (1 of the 2 steps runs) → one ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames. The frame
    count is the video's (the call has no ``num_frames``: ``make_kwargs`` turns it into the video). About
    0.1 s a call on 2 CPU cores; no audio."""
    pipe = _pipeline(
        WanVideoToVideoPipeline,
        vae=tiny_wan21(),
        transformer=_seeded(
            WanTransformer3DModel, {**_WAN_TRANSFORMER, "in_channels": 16, "out_channels": 16}
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    base = _video_kwargs(16, 6.0, _prompt_pair(_WAN_TEXT_DIM))

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("video", _frames(kwargs.pop("num_frames"), 16, seed=3))
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# SkyReels-V2: text / image to video, diffusion forcing from an image or a video
# ---------------------------------------------------------------------------------------------------------


def _skyreels_scheduler() -> UniPCMultistepScheduler:
    """diffusers' SkyReels-V2 tests' UniPC scheduler, with the flow prediction of the released checkpoints
    (flow shift 5)."""
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)


def _skyreels(pipeline_class: Any, transformer: dict[str, Any] | None = None, **components: Any) -> Pipeline:
    return _pipeline(
        pipeline_class,
        vae=tiny_wan21(),
        transformer=_seeded(SkyReelsV2Transformer3DModel, {**_SKYREELS_TRANSFORMER, **(transformer or {})}),
        scheduler=_skyreels_scheduler(),
        **components,
    )


@functools.cache
def skyreels_v2() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 text to video (``tiny_wan21``): 16×16, 9 frames → one ``vae.decode`` of
    [1, 16, 3, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    return _skyreels(SkyReelsV2Pipeline), _video_kwargs(16, 6.0, _prompt_pair(_WAN_TEXT_DIM))


@functools.cache
def skyreels_v2_i2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 image to video (Wan 2.1 I2V's layout: CLIP image embeddings from a tiny vision tower, 36
    input channels = noise, mask, condition): a 16×16 image, 9 frames → ``vae.encode`` of the image and 8
    zero frames, then one ``vae.decode`` of [1, 16, 3, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    image_encoder = _seeded(CLIPVisionModelWithProjection, {"config": CLIPVisionConfig(**_CLIP_VISION)})
    pipe = _skyreels(
        SkyReelsV2ImageToVideoPipeline,
        transformer={"in_channels": 16 + 4 + 16, "image_dim": _CLIP_VISION["hidden_size"]},
        image_encoder=image_encoder,
        image_processor=CLIPImageProcessorPil(crop_size=16, size=16),
    )
    return pipe, _video_kwargs(16, 6.0, _prompt_pair(_WAN_TEXT_DIM), image=True)


@functools.cache
def skyreels_v2_df_i2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing from an image, short mode (``base_num_frames`` 9): the image's latent
    is the first of [1, 16, 3, 2, 2]; one ``vae.decode`` of them → 9 frames. With ``last_image`` the last
    image's latent is appended for the denoising and dropped before the decode. About 0.1 s a call on 2 CPU
    cores; no audio."""
    pipe = _skyreels(SkyReelsV2DiffusionForcingImageToVideoPipeline)
    base = _skyreels_kwargs(base_num_frames=9)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("image", _frames(1, 16, seed=3)[0])
        return kwargs

    return pipe, make_kwargs


@functools.cache
def skyreels_v2_df_v2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing, extending a video: a 7-frame 16×16 noise video, ``num_frames`` 9 new
    frames, ``overlap_history`` 5 (the video's last 5 frames, 2 latents, are encoded as the prefix),
    ``base_num_frames`` 9 → one iteration; one ``vae.decode`` of [1, 16, 3, 2, 2] (the 2 prefix latents and
    1 new one → 9 frames), which the pipeline appends to the 7 input frames themselves (preprocessed, not
    re-decoded): ``.frames`` [1, 7 + 9, 16, 16, 3]. Not a decode-once pipeline: the input video's pixels
    lead the output. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _skyreels(SkyReelsV2DiffusionForcingVideoToVideoPipeline)
    base = _skyreels_kwargs(base_num_frames=9, overlap_history=5)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("video", _frames(7, 16, seed=3))
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# HunyuanVideo image to video (HunyuanVideo-I2V, SkyReels-V1), HunyuanVideo 1.5 image to video
# ---------------------------------------------------------------------------------------------------------


def _hunyuan_prompt_pair() -> dict[str, Any]:
    """HunyuanVideo's prompt embeddings (LLaMA [1, 16, 16], pooled CLIP [1, 8], an all-ones mask) for the
    prompt (seeds 1, 2) and the negative prompt (seeds 3, 4)."""
    kwargs: dict[str, Any] = {}
    for prefix, seed in (("", 1), ("negative_", 3)):
        kwargs[f"{prefix}prompt_embeds"] = _randn(1, _TEXT_TOKENS, 16, seed=seed)
        kwargs[f"{prefix}pooled_prompt_embeds"] = _randn(1, 8, seed=seed + 1)
        kwargs[f"{prefix}prompt_attention_mask"] = torch.ones(1, _TEXT_TOKENS)
    return kwargs


def _hunyuan_i2v(pipeline_class: Any, **transformer: Any) -> Pipeline:
    return _pipeline(
        pipeline_class,
        transformer=_seeded(HunyuanVideoTransformer3DModel, {**_HUNYUAN_TRANSFORMER, **transformer}),
        vae=tiny_hunyuan_video(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        **({"image_processor": None} if pipeline_class is HunyuanVideoImageToVideoPipeline else {}),
    )


@functools.cache
def hunyuan_video_i2v() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo-I2V, ``image_condition_type`` "latent_concat" (diffusers' test config: 9 input channels
    = noise, the image latent repeated with later frames zeroed, a mask; no guidance embedding;
    ``tiny_hunyuan_video``): a 16×16 image, ``num_frames`` 9 → ``vae.encode`` of the image, one
    ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames, of which the pipeline drops the first 4 (the image's
    latent's frames): ``.frames`` [1, 5, 16, 16, 3]. The ``"latent"`` output drops the first latent too:
    [1, 4, 2, 2, 2]. Not a plain decode-once pipeline (it cuts 4 frames from the front of its decode). About
    0.05 s a call on 2 CPU cores; no audio."""
    pipe = _hunyuan_i2v(
        HunyuanVideoImageToVideoPipeline,
        in_channels=2 * 4 + 1,
        guidance_embeds=False,
        image_condition_type="latent_concat",
    )
    return pipe, _video_kwargs(16, 1.0, _hunyuan_prompt_pair, image=True)


@functools.cache
def hunyuan_video_i2v_token_replace() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo-I2V, ``image_condition_type`` "token_replace" (the image's latent replaces the first
    latent frame at every step; 4 input channels, distilled guidance 4.5; ``tiny_hunyuan_video``): a 16×16
    image, 9 frames → one ``vae.decode`` of [1, 4, 3, 2, 2], every frame kept: ``.frames``
    [1, 9, 16, 16, 3]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _hunyuan_i2v(HunyuanVideoImageToVideoPipeline, image_condition_type="token_replace")
    return pipe, _video_kwargs(16, 4.5, _hunyuan_prompt_pair, image=True)


@functools.cache
def hunyuan_skyreels_i2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V1 (HunyuanVideo) image to video (diffusers' test config: 8 input channels = noise and the
    image latent padded with zeros; distilled guidance embedding, true classifier-free guidance 6.0 from
    the negative embeddings; ``tiny_hunyuan_video``): a 16×16 image, 9 frames → ``vae.encode`` of the
    image, one ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _hunyuan_i2v(HunyuanSkyreelsImageToVideoPipeline, in_channels=8)
    return pipe, _video_kwargs(16, 4.5, _hunyuan_prompt_pair, image=True)


@functools.cache
def hunyuan_video15_i2v() -> tuple[Pipeline, MakeKwargs]:
    """HunyuanVideo 1.5 image to video (``tiny_hunyuan_video15``, a tiny SigLIP image encoder, guidance 6.0
    from its guider; the call has no ``height`` / ``width`` / ``guidance_scale``): the size is the image's,
    fitted to the transformer's ``target_size`` 16 → 16×16; 9 frames → ``vae.encode`` of the image, one
    ``vae.decode(latents / scaling_factor, return_dict=False)`` of [1, 4, 3, 2, 2] → ``.frames``
    [1, 9, 16, 16, 3]. About 0.1 s a call on 2 CPU cores; no audio."""
    transformer = {
        **_HUNYUAN15_TRANSFORMER,
        "image_embed_dim": _SIGLIP_VISION["hidden_size"],
        "task_type": "i2v",
    }
    pipe = _pipeline(
        HunyuanVideo15ImageToVideoPipeline,
        transformer=_seeded(HunyuanVideo15Transformer3DModel, transformer),
        vae=tiny_hunyuan_video15(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
        image_encoder=_seeded(SiglipVisionModel, {"config": SiglipVisionConfig(**_SIGLIP_VISION)}),
        feature_extractor=SiglipImageProcessorPil(size={"height": 30, "width": 30}),
    )
    base = _call_kwargs(_hunyuan15_prompt, num_frames=9)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("image", _frames(1, 16, seed=3)[0])
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# CogVideoX: image / video to video, Fun control, ConsisID (frames-first latents)
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/cogvideo I2V transformer: latents and image latents in (4 + 4), rotary and
#: learned positions (which fix the size: 16×16, 9 frames).
_COG_I2V_TRANSFORMER: dict[str, Any] = {
    **_COG_TRANSFORMER,
    "in_channels": 8,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "use_rotary_positional_embeddings": True,
    "use_learned_positional_embeddings": True,
}


def _cog(pipeline_class: Any, model_class: Any, transformer: dict[str, Any]) -> Pipeline:
    """A tiny CogVideoX-family pipeline with ``tiny_cogvideox`` (4 channels, 4× in time, 8× in space)."""
    return _pipeline(
        pipeline_class,
        transformer=_seeded(model_class, transformer),
        vae=tiny_cogvideox(),
        scheduler=CogVideoXDDIMScheduler(),
    )


@functools.cache
def cogvideox_i2v() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX 1.0 image to video (diffusers' test transformer): a 16×16 image, 9 frames → ``vae.encode``
    of the image, one ``vae.decode(latents / scaling_factor)`` of [1, 4, 3, 2, 2] → 9 frames; the
    ``"latent"`` output is frames-first [1, 3, 4, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _cog(CogVideoXImageToVideoPipeline, CogVideoXTransformer3DModel, _COG_I2V_TRANSFORMER)
    return pipe, _video_kwargs(16, 6.0, _prompt_pair(_COG_TEXT_DIM), image=True)


@functools.cache
def cogvideox15_i2v() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX 1.5 image to video (``patch_size_t`` 2, rotary positions only): 3 latent frames are padded
    to 4 in front (the ``"latent"`` output keeps the padding: [1, 4, 4, 2, 2]); the padding is dropped
    before the one ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames. About 0.1 s a call on 2 CPU cores; no
    audio."""
    transformer = {
        **_COG_I2V_TRANSFORMER,
        "use_learned_positional_embeddings": False,
        "patch_size_t": 2,
    }
    pipe = _cog(CogVideoXImageToVideoPipeline, CogVideoXTransformer3DModel, transformer)
    return pipe, _video_kwargs(16, 6.0, _prompt_pair(_COG_TEXT_DIM), image=True)


@functools.cache
def cogvideox_v2v() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX video to video (the transformer of ``tests._pipelines.cogvideox``): a 9-frame 16×16 noise
    video, encoded and noised to ``strength`` 0.8 (1 of 2 steps) → one ``vae.decode`` of [1, 4, 3, 2, 2] →
    9 frames. ``make_kwargs`` turns ``num_frames`` into the video (the call has none). About 0.1 s a call on 2
    CPU cores; no audio."""
    transformer = {**_COG_TRANSFORMER, "num_attention_heads": 4, "attention_head_dim": 8}
    pipe = _cog(CogVideoXVideoToVideoPipeline, CogVideoXTransformer3DModel, transformer)
    base = _video_kwargs(16, 6.0, _prompt_pair(_COG_TEXT_DIM))

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("video", _frames(kwargs.pop("num_frames"), 16, seed=3))
        return kwargs

    return pipe, make_kwargs


@functools.cache
def cogvideox_fun_control() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX-Fun control (diffusers' test transformer: latents and control-video latents in, 4 + 4): a
    9-frame 16×16 noise control video → ``vae.encode`` of it, one ``vae.decode`` of [1, 4, 3, 2, 2] → 9
    frames. ``make_kwargs`` turns ``num_frames`` into the control video. About 0.1 s a call on 2 CPU cores; no
    audio."""
    transformer = {**_COG_TRANSFORMER, "in_channels": 8, "num_attention_heads": 4, "attention_head_dim": 8}
    pipe = _cog(CogVideoXFunControlPipeline, CogVideoXTransformer3DModel, transformer)
    base = _video_kwargs(16, 6.0, _prompt_pair(_COG_TEXT_DIM))

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("control_video", _frames(kwargs.pop("num_frames"), 16, seed=3))
        return kwargs

    return pipe, make_kwargs


#: diffusers' tests/pipelines/consisid transformer: CogVideoX I2V's, with the face-identity blocks.
_CONSISID_TRANSFORMER: dict[str, Any] = {
    **_COG_I2V_TRANSFORMER,
    "cross_attn_interval": 1,
    "is_kps": False,
    "is_train_face": True,
    "cross_attn_dim_head": 1,
    "cross_attn_num_heads": 1,
    "LFE_id_dim": 2,
    "LFE_vit_dim": 2,
    "LFE_depth": 5,
    "LFE_dim_head": 8,
    "LFE_num_heads": 2,
    "LFE_num_id_token": 1,
    "LFE_num_querie": 1,
    "LFE_output_dim": 21,
    "LFE_ff_mult": 1,
    "LFE_num_scale": 1,
}


@functools.cache
def consisid() -> tuple[Pipeline, MakeKwargs]:
    """ConsisID identity-preserving image to video (diffusers' test config; the face features a face
    model would give are passed: ``id_vit_hidden`` [[1, 2, 2]], ``id_cond`` [1, 2]): a 16×16 image, 9
    frames → ``vae.encode`` of the image, one ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames; ``"latent"``
    output frames-first [1, 3, 4, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _cog(ConsisIDPipeline, ConsisIDTransformer3DModel, _CONSISID_TRANSFORMER)
    base = _video_kwargs(16, 6.0, _prompt_pair(_COG_TEXT_DIM), image=True)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("id_vit_hidden", [torch.ones(1, 2, 2)])
        kwargs.setdefault("id_cond", torch.ones(1, 2))
        return kwargs

    return pipe, make_kwargs


# ---------------------------------------------------------------------------------------------------------
# LTX-2 image to video: video and sound
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def ltx2_i2v() -> tuple[Pipeline, MakeKwargs]:
    """LTX-2 image to video and sound, the parts of ``tests._pipelines_more.ltx2`` (``tiny_ltx2_video``, the
    tiny audio VAE and a vocoder upsampling by the mel hop): a 32×32 image, 9 frames at 24 fps →
    ``.frames`` [1, 9, 32, 32, 3] and ``.audio`` [1, 2, 5280] float32 at 16 kHz
    (``pipe.vocoder.config.output_sampling_rate``; ``pipe.audio_sampling_rate`` is the audio VAE's
    ``sample_rate``, also 16000).

    ``vae.encode`` of the image (its latent conditions the first latent frame), then one
    ``vae.decode(latents, None, return_dict=False)`` of [1, 8, 2, 4, 4] (unpacked, de-normalized), then one
    ``audio_vae.decode`` of [1, 2, 9, 2] and the vocoder, as LTX2Pipeline. ``image_crf`` is 0: the default
    (33) re-encodes the image through H.264 first, and x264 on a frame narrower than 64 pixels is not
    bit-reproducible. ``output_type="latent"``: ``.frames`` [1, 8, 2, 4, 4], ``.audio`` [1, 2, 9, 2]. About
    0.15 s a call on 2 CPU cores.
    """
    pipe = _pipeline(
        LTX2ImageToVideoPipeline,
        transformer=_seeded(LTX2VideoTransformer3DModel, _LTX2_TRANSFORMER),
        connectors=_seeded(LTX2TextConnectors, _LTX2_CONNECTORS),
        vae=tiny_ltx2_video(),
        audio_vae=_seeded(AutoencoderKLLTX2Audio, _LTX2_AUDIO_VAE),
        vocoder=_seeded(LTX2Vocoder, _LTX2_VOCODER),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    prompt = _prompt_pair(_LTX2_CAPTION * _LTX2_TEXT_LAYERS, mask_dtype=torch.long)
    return pipe, _video_kwargs(32, 3.0, prompt, image=True, image_crf=0, **_LTX2_GUIDANCE)


# ---------------------------------------------------------------------------------------------------------
# Stable Video Diffusion (a 2D VAE with a temporal decoder, frames as the batch)
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/stable_video_diffusion UNet (latents and the image latent in, 4 + 4).
_SVD_UNET: dict[str, Any] = {
    "block_out_channels": (32, 64),
    "layers_per_block": 2,
    "sample_size": 32,
    "in_channels": 8,
    "out_channels": 4,
    "down_block_types": ("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
    "up_block_types": ("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
    "cross_attention_dim": 32,
    "num_attention_heads": 8,
    "projection_class_embeddings_input_dim": 96,
    "addition_time_embed_dim": 32,
}
#: diffusers' test scheduler (SVD's released one: v-prediction, Karras sigmas).
_SVD_SCHEDULER: dict[str, Any] = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "sigma_max": 700.0,
    "sigma_min": 0.002,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "timestep_type": "continuous",
    "trained_betas": None,
    "use_karras_sigmas": True,
}
#: diffusers' test CLIP vision tower, at the 224×224 the pipeline resizes a PIL image to before the image
#: encoder (diffusers' test passes a tensor, which it does not resize), in 32-pixel patches (7×7 tokens).
_SVD_CLIP_VISION: dict[str, Any] = {
    "hidden_size": 32,
    "projection_dim": 32,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "image_size": 224,
    "intermediate_size": 37,
    "patch_size": 32,
}


@functools.cache
def stable_video_diffusion() -> tuple[Pipeline, MakeKwargs]:
    """Stable Video Diffusion image to video (``tiny_stable_video``: 4 channels, 2× in space, one frame per
    latent; diffusers' test UNet, CLIP image encoder and scheduler; guidance from 1.0 to 2.5 over the
    frames): a 16×16 image, ``num_frames`` 4 → ``vae.encode`` of the noised image, one
    ``vae.decode(latents / scaling_factor, num_frames=4)`` of [4, 4, 8, 8] (the frames are the batch:
    ``decode_chunk_size`` defaults to ``num_frames``) → ``.frames`` [1, 4, 16, 16, 3]. The ``"latent"``
    output is frames first, [1, 4, 4, 8, 8]. A ``decode_chunk_size`` below ``num_frames`` decodes in
    several calls (the temporal decoder then sees each chunk alone). Not a plain decode-once pipeline: it
    decodes ``[B·F, C, h, w]`` frames as a batch with ``num_frames``, in ``decode_chunk_size`` chunks. About
    0.35 s a call on 2 CPU cores; no audio."""
    pipe = _pipeline(
        StableVideoDiffusionPipeline,
        vae=tiny_stable_video(),
        unet=_seeded(UNetSpatioTemporalConditionModel, _SVD_UNET),
        scheduler=EulerDiscreteScheduler(**_SVD_SCHEDULER),
        image_encoder=_seeded(
            CLIPVisionModelWithProjection, {"config": CLIPVisionConfig(**_SVD_CLIP_VISION)}
        ),
        feature_extractor=CLIPImageProcessorPil(crop_size=224, size=224),
    )
    fixed = {"height": 16, "width": 16, "num_frames": 4, "min_guidance_scale": 1.0, "max_guidance_scale": 2.5}
    return pipe, _call_kwargs(lambda: {"image": _image(16)}, **fixed)


# ---------------------------------------------------------------------------------------------------------
# EasyAnimate (Magvit VAE)
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/easyanimate transformer, with 2 heads of 16 (its rotary embedding splits a head
#: 4 / 6 / 6 over time, height, width; the test's 4 heads of 8 give an odd split, which 0.42.1 rejects).
_EASYANIMATE_TRANSFORMER: dict[str, Any] = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "in_channels": 4,
    "out_channels": 4,
    "time_embed_dim": 2,
    "text_embed_dim": 16,
    "num_layers": 1,
    "sample_width": 16,
    "sample_height": 16,
    "patch_size": 2,
}


@functools.cache
def easyanimate() -> tuple[Pipeline, MakeKwargs]:
    """EasyAnimate text to video (``tiny_magvit``: 4 channels, 4× in time, 8× in space; diffusers' test
    transformer): 16×16, 9 frames → one ``vae.decode(latents / scaling_factor, return_dict=False)`` of
    [1, 4, 3, 2, 2] → 9 frames. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _pipeline(
        EasyAnimatePipeline,
        vae=tiny_magvit(),
        transformer=_seeded(EasyAnimateTransformer3DModel, _EASYANIMATE_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    return pipe, _video_kwargs(16, 6.0, _prompt_pair(16, mask_dtype=torch.long))


# ---------------------------------------------------------------------------------------------------------
# Kandinsky 5 image to video (HunyuanVideo VAE, channels-last latents)
# ---------------------------------------------------------------------------------------------------------


@functools.cache
def kandinsky5_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Kandinsky 5 image to video (``tests._pipelines_clips.kandinsky5_t2v``'s transformer with
    ``visual_cond``: noise, a zero condition and a first-frame mask in; ``tiny_hunyuan_video``): a 32×32
    image, 17 frames → ``vae.encode`` of the image (sampled from the call's generator), its latent the
    first of [1, 5, 4, 4, 4] (channels last), not denoised. After the loop the pipeline re-normalizes the
    first 4 latent frames to the mean and std of the (up to 5) after them (``normalize_first_frame``, also
    for the ``"latent"`` output [1, 5, 4, 4, 4]), then one ``vae.decode`` of [1, 4, 5, 4, 4] → 17 frames.

    ``num_frames`` must be 17 or more: with 4 latent frames or fewer there are none after the first 4,
    their std is NaN, and so is every pixel (diffusers 0.42.1). About 0.25 s a call on 2 CPU cores; no
    audio."""
    pipe = _pipeline(
        Kandinsky5I2VPipeline,
        vae=tiny_hunyuan_video(),
        transformer=_seeded(Kandinsky5Transformer3DModel, {**_KANDINSKY_TRANSFORMER, "visual_cond": True}),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    return pipe, _video_kwargs(32, 5.0, _kandinsky_prompt, image=True, num_frames=17)


# ---------------------------------------------------------------------------------------------------------
# Wan-based editing and distilled pipelines: ChronoEdit, Lucy Edit, Motif-Video, AnyFlow
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/chronoedit transformer: Wan 2.1 I2V's layout (noise, mask, condition in).
_CHRONOEDIT_TRANSFORMER: dict[str, Any] = {
    **_WAN_TRANSFORMER,
    "in_channels": 16 + 4 + 16,
    "out_channels": 16,
    "image_dim": _CLIP_VISION["hidden_size"],
}


@functools.cache
def chronoedit() -> tuple[Pipeline, MakeKwargs]:
    """ChronoEdit image editing as a video (``tiny_wan21``, the CLIP vision tower of
    ``tests._pipelines.wan21_i2v``; a flow UniPC scheduler, as the temporal-reasoning mode needs a multistep
    one): a 16×16 image. Without temporal reasoning the call makes 5 frames whatever ``num_frames`` says:
    ``vae.encode`` of the image and 4 zero frames, one ``vae.decode`` of [1, 16, 2, 2, 2] → 5 frames (the
    edit is the last one).

    ``enable_temporal_reasoning=True`` takes ``num_frames`` (9: 3 latents) and, at step
    ``num_temporal_reasoning_steps``, cuts the latents to their first and last frames: with 1, one decode
    of [1, 16, 2, 2, 2] → 5 frames. With ``num_temporal_reasoning_steps`` ≥ ``num_inference_steps`` the cut
    never happens and the pipeline decodes twice, the first and last latents ("edit") and all but the last
    ("reasoning"), and returns the reasoning frames followed by the edit's after its first: 5 + 4 = 9. About
    0.1 s a call on 2 CPU cores; no audio.
    """
    image_encoder = _seeded(CLIPVisionModelWithProjection, {"config": CLIPVisionConfig(**_CLIP_VISION)})
    pipe = _pipeline(
        ChronoEditPipeline,
        vae=tiny_wan21(),
        transformer=_seeded(ChronoEditTransformer3DModel, _CHRONOEDIT_TRANSFORMER),
        scheduler=_skyreels_scheduler(),
        image_encoder=image_encoder,
        image_processor=CLIPImageProcessorPil(crop_size=16, size=16),
    )
    return pipe, _video_kwargs(16, 6.0, _prompt_pair(_WAN_TEXT_DIM), image=True, num_frames=5)


@functools.cache
def lucy_edit() -> tuple[Pipeline, MakeKwargs]:
    """Lucy Edit video editing (Wan 2.2 TI2V-5B layout: ``tiny_wan22``, a Wan transformer taking the noise
    and the source video's latents, 48 + 48 channels): a 9-frame 32×32 noise video → ``vae.encode`` of it,
    one ``vae.decode`` of [1, 48, 3, 2, 2] → 9 frames. ``num_frames`` also sets the source video's
    length. About 0.1 s a call on 2 CPU cores; no audio."""
    transformer = {**_WAN_TRANSFORMER, "in_channels": 48 + 48, "out_channels": 48}
    pipe = _pipeline(
        LucyEditPipeline,
        vae=tiny_wan22(),
        transformer=_seeded(WanTransformer3DModel, transformer),
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
    )
    base = _video_kwargs(32, 5.0, _prompt_pair(_WAN_TEXT_DIM))

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = base(**overrides)
        kwargs.setdefault("video", _frames(kwargs["num_frames"], 32, seed=3))
        return kwargs

    return pipe, make_kwargs


#: diffusers' tests/pipelines/motif_video transformer (noise, a condition and a mask in: 16 + 16 + 1).
_MOTIF_TRANSFORMER: dict[str, Any] = {
    "in_channels": 33,
    "out_channels": 16,
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "num_layers": 1,
    "num_single_layers": 1,
    "mlp_ratio": 4.0,
    "patch_size": 1,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "text_embed_dim": 32,
    "rope_axes_dim": (4, 4, 4),
}


@functools.cache
def motif_video() -> tuple[Pipeline, MakeKwargs]:
    """Motif-Video text to video (``tiny_wan21``; diffusers' test transformer and its default
    ``AdaptiveProjectedGuidance`` guider; the call has no ``guidance_scale``): 16×16, 9 frames → one
    ``vae.decode`` of the de-normalized [1, 16, 3, 2, 2] → 9 frames. ``vae_batch_size`` below the batch
    decodes the batch in several calls. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _pipeline(
        MotifVideoPipeline,
        vae=tiny_wan21(),
        transformer=_seeded(MotifVideoTransformer3DModel, _MOTIF_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        guider=AdaptiveProjectedGuidance(),
    )
    prompt = _prompt_pair(_WAN_TEXT_DIM, mask_dtype=torch.long)
    return pipe, _call_kwargs(prompt, height=16, width=16, num_frames=9)


#: diffusers' tests/pipelines/anyflow transformer (a Wan transformer with a flow-map time embedding).
_ANYFLOW_TRANSFORMER: dict[str, Any] = {
    **{key: value for key, value in _WAN_TRANSFORMER.items() if key != "qk_norm"},
    "in_channels": 16,
    "out_channels": 16,
    "gate_value": 0.25,
    "deltatime_type": "r",
}


@functools.cache
def anyflow() -> tuple[Pipeline, MakeKwargs]:
    """AnyFlow text to video (flow-map distilled Wan 2.1: ``tiny_wan21``, diffusers' test transformer and
    ``FlowMapEulerDiscreteScheduler``): 16×16, 9 frames, denoised frames first ([1, 3, 16, 2, 2]) and
    permuted back after the loop: one ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames; the ``"latent"``
    output is the permuted [1, 16, 3, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _pipeline(
        AnyFlowPipeline,
        vae=tiny_wan21(),
        transformer=_seeded(AnyFlowTransformer3DModel, _ANYFLOW_TRANSFORMER),
        scheduler=FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0),
    )
    return pipe, _video_kwargs(16, 6.0, _prompt_pair(_WAN_TEXT_DIM))


# ---------------------------------------------------------------------------------------------------------
# Index
# ---------------------------------------------------------------------------------------------------------

#: Builder name → builder; each builds its pipeline once per process (do not mutate what it returns).
BUILDERS: dict[str, Builder] = {
    "wan_vace": wan_vace,
    "wan_v2v": wan_v2v,
    "skyreels_v2": skyreels_v2,
    "skyreels_v2_i2v": skyreels_v2_i2v,
    "skyreels_v2_df_i2v": skyreels_v2_df_i2v,
    "skyreels_v2_df_v2v": skyreels_v2_df_v2v,
    "hunyuan_video_i2v": hunyuan_video_i2v,
    "hunyuan_video_i2v_token_replace": hunyuan_video_i2v_token_replace,
    "hunyuan_skyreels_i2v": hunyuan_skyreels_i2v,
    "hunyuan_video15_i2v": hunyuan_video15_i2v,
    "cogvideox_i2v": cogvideox_i2v,
    "cogvideox15_i2v": cogvideox15_i2v,
    "cogvideox_v2v": cogvideox_v2v,
    "cogvideox_fun_control": cogvideox_fun_control,
    # ConsisIDPipeline is a placeholder that raises without OpenCV (``cv2``), not a dependency of streamvae
    **({"consisid": consisid} if importlib.util.find_spec("cv2") is not None else {}),
    "ltx2_i2v": ltx2_i2v,
    "stable_video_diffusion": stable_video_diffusion,
    "easyanimate": easyanimate,
    "kandinsky5_i2v": kandinsky5_i2v,
    "chronoedit": chronoedit,
    "lucy_edit": lucy_edit,
    "motif_video": motif_video,
    "anyflow": anyflow,
}

_COG = Expected(frames=(1, 9, 16, 16, 3), latents=(1, 3, 4, 2, 2))  # latents frames first

#: Builder name → output shapes with the builder's default kwargs.
EXPECTED: dict[str, Expected] = {
    "wan_vace": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 4, 2, 2)),
    "wan_v2v": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
    "skyreels_v2": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
    "skyreels_v2_i2v": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
    "skyreels_v2_df_i2v": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
    "skyreels_v2_df_v2v": Expected(frames=(1, 16, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
    "hunyuan_video_i2v": Expected(frames=(1, 5, 16, 16, 3), latents=(1, 4, 2, 2, 2)),
    "hunyuan_video_i2v_token_replace": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2)),
    "hunyuan_skyreels_i2v": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2)),
    "hunyuan_video15_i2v": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2)),
    "cogvideox_i2v": _COG,
    "cogvideox15_i2v": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 4, 2, 2)),
    "cogvideox_v2v": _COG,
    "cogvideox_fun_control": _COG,
    "consisid": _COG,
    "ltx2_i2v": Expected(frames=(1, 9, 32, 32, 3), latents=(1, 8, 2, 4, 4)),  # unpacked, de-normalized
    "stable_video_diffusion": Expected(frames=(1, 4, 16, 16, 3), latents=(1, 4, 4, 8, 8)),  # frames first
    "easyanimate": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 2, 2)),
    "kandinsky5_i2v": Expected(frames=(1, 17, 32, 32, 3), latents=(1, 5, 4, 4, 4)),  # [B, T, h, w, C]
    "chronoedit": Expected(frames=(1, 5, 16, 16, 3), latents=(1, 16, 2, 2, 2)),
    "lucy_edit": Expected(frames=(1, 9, 32, 32, 3), latents=(1, 48, 3, 2, 2)),
    "motif_video": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
    "anyflow": Expected(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2)),
}

#: Builder name → its soundtrack with the builder's default kwargs (``output.audio``).
AUDIO: dict[str, ExpectedAudio] = {
    "ltx2_i2v": ExpectedAudio(shape=(1, 2, 5280), sample_rate=_LTX2_SAMPLE_RATE, latents=(1, 2, 9, 2)),
}
