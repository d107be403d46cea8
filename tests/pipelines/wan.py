"""Wan builders: Wan 2.1 / 2.2 text and image to video, VACE, video to video, Wan-Animate, and the pipelines
built on a Wan transformer and VAE (ChronoEdit, Lucy Edit, Motif-Video, AnyFlow).

Every one decodes once after its denoising loop but Wan-Animate, which decodes each segment and conditions
the next on its last decoded frame. Wan VAEs come from :mod:`tests._vaes` (weights re-drawn so the video
spans the value range). :data:`WAN_TRANSFORMER`, :data:`CLIP_VISION` and :func:`flow_unipc` serve the
other families built on Wan's parts (SkyReels-V2, Helios, the modular Wan pipelines).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AdaptiveProjectedGuidance,
    AnyFlowFARPipeline,
    AnyFlowFARTransformer3DModel,
    AnyFlowPipeline,
    AnyFlowTransformer3DModel,
    ChronoEditPipeline,
    ChronoEditTransformer3DModel,
    FlowMapEulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    LucyEditPipeline,
    MotifVideoImage2VideoPipeline,
    MotifVideoPipeline,
    MotifVideoTransformer3DModel,
    UniPCMultistepScheduler,
    WanAnimatePipeline,
    WanAnimateTransformer3DModel,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
    WanVACEPipeline,
    WanVACETransformer3DModel,
    WanVideoToVideoPipeline,
)
from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModelWithProjection

from tests._vaes import tiny_wan21, tiny_wan22
from tests.pipelines._shared import (
    MakeKwargs,
    Pipeline,
    builder,
    call_kwargs,
    noise_frames,
    noise_video,
    pipeline,
    prompt_pair,
    seeded,
    video_kwargs,
)

WAN_TEXT_DIM = 32  # the text_dim of every Wan-style transformer (diffusers' tests)
#: diffusers' tiny Wan transformer (tests/pipelines/wan), less its latent channels.
WAN_TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "text_dim": WAN_TEXT_DIM,
    "freq_dim": 256,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32,
}
#: The tiny Wan transformer with Wan 2.1's 16 latent channels in and out.
WAN21_TRANSFORMER: dict[str, Any] = {**WAN_TRANSFORMER, "in_channels": 16, "out_channels": 16}
#: A tiny CLIP vision tower: WanImageToVideoPipeline will not take ``image_embeds`` with an ``image``.
CLIP_VISION: dict[str, Any] = {
    "hidden_size": 4,
    "projection_dim": 4,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 16,
    "intermediate_size": 16,
    "patch_size": 4,
}


def clip_image_encoder() -> dict[str, Any]:
    """The ``image_encoder`` (the :data:`CLIP_VISION` tower, seeded) and ``image_processor`` (16×16) of a
    Wan 2.1 image-to-video layout."""
    return {
        "image_encoder": seeded(CLIPVisionModelWithProjection, {"config": CLIPVisionConfig(**CLIP_VISION)}),
        "image_processor": CLIPImageProcessorPil(crop_size=16, size=16),
    }


def flow_unipc(shift: float) -> UniPCMultistepScheduler:
    """The flow-matching UniPC scheduler of Wan 2.2 and SkyReels-V2, with flow shift ``shift``."""
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift)


# ---------------------------------------------------------------------------------------------------------
# Wan 2.1 / 2.2 (WanPipeline, WanImageToVideoPipeline)
# ---------------------------------------------------------------------------------------------------------


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
    tiny_wan22, 48, lambda: flow_unipc(3.0), 32, 5.0, {"expand_timesteps": True}
)


def _wan(
    pipeline_class: type[WanPipeline] | type[WanImageToVideoPipeline],
    version: _WanVersion,
    transformer: Mapping[str, Any] | None = None,
    **components: Any,
) -> tuple[Pipeline, MakeKwargs]:
    """A tiny Wan pipeline of ``version``; ``transformer`` adds to its transformer's config."""
    channels = {"in_channels": version.channels, "out_channels": version.channels}
    pipe = pipeline(
        pipeline_class,
        vae=version.vae(),
        transformer=seeded(WanTransformer3DModel, {**WAN_TRANSFORMER, **channels, **(transformer or {})}),
        scheduler=version.scheduler(),
        **version.components,
        **components,
    )
    image = pipeline_class is WanImageToVideoPipeline
    prompt = prompt_pair(WAN_TEXT_DIM)
    return pipe, video_kwargs(version.size, version.guidance_scale, prompt, image=image)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2), core=True)
def wan21() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 text-to-video: 16×16, 9 frames → latents [1, 16, 3, 2, 2]."""
    return _wan(WanPipeline, _WAN_2_1)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 48, 3, 2, 2), core=True)
def wan22() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.2 TI2V-5B layout, text-to-video (48 channels, 16× spatial, ``expand_timesteps``): 32×32, 9 frames
    → latents [1, 48, 3, 2, 2]."""
    return _wan(WanPipeline, _WAN_2_2)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2), core=True)
def wan21_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 image-to-video (CLIP image embeddings, 36 input channels): 16×16, 9 frames → latents
    [1, 16, 3, 2, 2]."""
    return _wan(
        WanImageToVideoPipeline,
        _WAN_2_1,
        transformer={"in_channels": 16 + 4 + 16, "image_dim": 4},  # noise, mask, condition
        **clip_image_encoder(),
    )


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 48, 3, 2, 2), core=True)
def wan22_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.2 TI2V-5B layout, image-to-video (the image's latent replaces the first latent frame, no image
    encoder): 32×32, 9 frames → latents [1, 48, 3, 2, 2]."""
    return _wan(WanImageToVideoPipeline, _WAN_2_2)


# ---------------------------------------------------------------------------------------------------------
# Wan 2.1: VACE, video to video
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tiny VACE transformer (tests/pipelines/wan/test_wan_vace.py): 3 blocks, VACE blocks at 0 and 2;
#: the VACE input is the inactive and reactive video latents (16 + 16) and the 8×8 mask patches (64).
_VACE_TRANSFORMER: dict[str, Any] = {
    **WAN21_TRANSFORMER,
    "num_layers": 3,
    "vace_layers": [0, 2],
    "vace_in_channels": 96,
}


def _masks(count: int, size: int) -> list[PIL.Image.Image]:
    """``count`` "L" masks ``size`` × ``size``: the left half kept (0), the right half generated (255)."""
    pixels = np.zeros((size, size), dtype=np.uint8)
    pixels[:, size // 2 :] = 255
    return [PIL.Image.fromarray(pixels, mode="L") for _ in range(count)]


def _vace_inputs(kwargs: dict[str, Any]) -> None:
    frames = kwargs["num_frames"]
    kwargs.setdefault("video", noise_frames(frames, 16, seed=3))
    kwargs.setdefault("mask", _masks(frames, 16))
    kwargs.setdefault("reference_images", noise_frames(1, 16, seed=4)[0])


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 4, 2, 2))
def wan_vace() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 VACE (``tiny_wan21``): a 9-frame 16×16 noise video, its right half masked to be generated,
    and one reference image. The reference takes a latent frame in front: the denoised latents are
    [1, 16, 1 + 3, 2, 2] (the ``"latent"`` output), and the pipeline drops the reference's frame before its
    one ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames (``vae.encode`` runs first, on the video and the
    reference). ``reference_images=None`` gives latents [1, 16, 3, 2, 2]. About 0.15 s a call on 2 CPU cores;
    no audio.
    """
    pipe = pipeline(
        WanVACEPipeline,
        vae=tiny_wan21(),
        transformer=seeded(WanVACETransformer3DModel, _VACE_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    return pipe, video_kwargs(16, 6.0, prompt_pair(WAN_TEXT_DIM), finish=_vace_inputs)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def wan_v2v() -> tuple[Pipeline, MakeKwargs]:
    """Wan 2.1 video to video (``tiny_wan21``): a 9-frame 16×16 noise video, encoded, noised to
    ``strength`` 0.8 (1 of the 2 steps runs) → one ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames. The frame
    count is the video's (the call has no ``num_frames``: ``make_kwargs`` turns it into the video). About
    0.1 s a call on 2 CPU cores; no audio."""
    pipe = pipeline(
        WanVideoToVideoPipeline,
        vae=tiny_wan21(),
        transformer=seeded(WanTransformer3DModel, WAN21_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    return pipe, video_kwargs(16, 6.0, prompt_pair(WAN_TEXT_DIM), finish=noise_video("video", 16))


# ---------------------------------------------------------------------------------------------------------
# Wan-Animate: segments, one decode per segment, the next conditioned on the last decoded frame
# ---------------------------------------------------------------------------------------------------------

_ANIMATE_SIZE = 16
#: diffusers' tiny Wan-Animate transformer (tests/pipelines/wan/test_wan_animate.py), with the CLIP vision
#: tower of :func:`wan21_i2v` (hidden size 4).
_ANIMATE_TRANSFORMER: dict[str, Any] = {
    **WAN_TRANSFORMER,
    "in_channels": 36,  # noise 16 + mask 4 + condition 16
    "latent_channels": 16,
    "out_channels": 16,
    "image_dim": CLIP_VISION["hidden_size"],
    "motion_encoder_channel_sizes": {"4": 16, "8": 16, "16": 16},
    "motion_encoder_size": _ANIMATE_SIZE,  # the face video's frame size
    "motion_style_dim": 8,
    "motion_dim": 4,
    "motion_encoder_dim": 16,
    "face_encoder_hidden_dim": 16,
    "face_encoder_num_heads": 2,
    "inject_face_latents_blocks": 2,
}


def _animate_inputs(kwargs: dict[str, Any]) -> None:
    frames = kwargs.pop("num_frames")
    kwargs.setdefault("pose_video", noise_frames(frames, _ANIMATE_SIZE, seed=3))
    kwargs.setdefault("face_video", noise_frames(frames, _ANIMATE_SIZE, seed=4))


@builder(frames=(1, 17, 16, 16, 3), latents=(1, 16, 4, 2, 2))
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
    pipe = pipeline(
        WanAnimatePipeline,
        vae=tiny_wan21(),
        transformer=seeded(WanAnimateTransformer3DModel, _ANIMATE_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        **clip_image_encoder(),
    )
    fixed: dict[str, Any] = {"num_frames": 17, "segment_frame_length": 9, "mode": "animate"}
    prompt = prompt_pair(WAN_TEXT_DIM)
    return pipe, video_kwargs(_ANIMATE_SIZE, 6.0, prompt, image=True, finish=_animate_inputs, **fixed)


# ---------------------------------------------------------------------------------------------------------
# Wan-based editing and distilled pipelines: ChronoEdit, Lucy Edit, Motif-Video, AnyFlow
# ---------------------------------------------------------------------------------------------------------

#: diffusers' tests/pipelines/chronoedit transformer: Wan 2.1 I2V's layout (noise, mask, condition in).
_CHRONOEDIT_TRANSFORMER: dict[str, Any] = {
    **WAN_TRANSFORMER,
    "in_channels": 16 + 4 + 16,
    "out_channels": 16,
    "image_dim": CLIP_VISION["hidden_size"],
}


@builder(frames=(1, 5, 16, 16, 3), latents=(1, 16, 2, 2, 2))
def chronoedit() -> tuple[Pipeline, MakeKwargs]:
    """ChronoEdit image editing as a video (``tiny_wan21``, the CLIP vision tower of :func:`wan21_i2v`; a
    flow UniPC scheduler, as the temporal-reasoning mode needs a multistep one): a 16×16 image. Without
    temporal reasoning the call makes 5 frames whatever ``num_frames`` says: ``vae.encode`` of the image
    and 4 zero frames, one ``vae.decode`` of [1, 16, 2, 2, 2] → 5 frames (the edit is the last one).

    ``enable_temporal_reasoning=True`` takes ``num_frames`` (9: 3 latents) and, at step
    ``num_temporal_reasoning_steps``, cuts the latents to their first and last frames: with 1, one decode
    of [1, 16, 2, 2, 2] → 5 frames. With ``num_temporal_reasoning_steps`` ≥ ``num_inference_steps`` the cut
    never happens and the pipeline decodes twice, the first and last latents ("edit") and all but the last
    ("reasoning"), and returns the reasoning frames followed by the edit's after its first: 5 + 4 = 9. About
    0.1 s a call on 2 CPU cores; no audio.
    """
    pipe = pipeline(
        ChronoEditPipeline,
        vae=tiny_wan21(),
        transformer=seeded(ChronoEditTransformer3DModel, _CHRONOEDIT_TRANSFORMER),
        scheduler=flow_unipc(5.0),
        **clip_image_encoder(),
    )
    return pipe, video_kwargs(16, 6.0, prompt_pair(WAN_TEXT_DIM), image=True, num_frames=5)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 48, 3, 2, 2))
def lucy_edit() -> tuple[Pipeline, MakeKwargs]:
    """Lucy Edit video editing (Wan 2.2 TI2V-5B layout: ``tiny_wan22``, a Wan transformer taking the noise
    and the source video's latents, 48 + 48 channels): a 9-frame 32×32 noise video → ``vae.encode`` of it,
    one ``vae.decode`` of [1, 48, 3, 2, 2] → 9 frames. ``num_frames`` also sets the source video's
    length. About 0.1 s a call on 2 CPU cores; no audio."""
    transformer = {**WAN_TRANSFORMER, "in_channels": 48 + 48, "out_channels": 48}
    pipe = pipeline(
        LucyEditPipeline,
        vae=tiny_wan22(),
        transformer=seeded(WanTransformer3DModel, transformer),
        scheduler=flow_unipc(3.0),
    )

    def source_video(kwargs: dict[str, Any]) -> None:
        kwargs.setdefault("video", noise_frames(kwargs["num_frames"], 32, seed=3))

    return pipe, video_kwargs(32, 5.0, prompt_pair(WAN_TEXT_DIM), finish=source_video)


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


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def motif_video() -> tuple[Pipeline, MakeKwargs]:
    """Motif-Video text to video (``tiny_wan21``; diffusers' test transformer and its default
    ``AdaptiveProjectedGuidance`` guider; the call has no ``guidance_scale``): 16×16, 9 frames → one
    ``vae.decode`` of the de-normalized [1, 16, 3, 2, 2] → 9 frames. ``vae_batch_size`` below the batch
    decodes the batch in several calls. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = pipeline(
        MotifVideoPipeline,
        vae=tiny_wan21(),
        transformer=seeded(MotifVideoTransformer3DModel, _MOTIF_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        guider=AdaptiveProjectedGuidance(),
    )
    prompt = prompt_pair(WAN_TEXT_DIM, mask_dtype=torch.long)
    return pipe, call_kwargs(prompt, height=16, width=16, num_frames=9)


#: diffusers' tests/pipelines/anyflow transformer (a Wan transformer with a flow-map time embedding).
_ANYFLOW_TRANSFORMER: dict[str, Any] = {
    **{key: value for key, value in WAN21_TRANSFORMER.items() if key != "qk_norm"},
    "gate_value": 0.25,
    "deltatime_type": "r",
}


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def anyflow() -> tuple[Pipeline, MakeKwargs]:
    """AnyFlow text to video (flow-map distilled Wan 2.1: ``tiny_wan21``, diffusers' test transformer and
    ``FlowMapEulerDiscreteScheduler``): 16×16, 9 frames, denoised frames first ([1, 3, 16, 2, 2]) and
    permuted back after the loop: one ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames; the ``"latent"``
    output is the permuted [1, 16, 3, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = pipeline(
        AnyFlowPipeline,
        vae=tiny_wan21(),
        transformer=seeded(AnyFlowTransformer3DModel, _ANYFLOW_TRANSFORMER),
        scheduler=FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0),
    )
    return pipe, video_kwargs(16, 6.0, prompt_pair(WAN_TEXT_DIM))


@builder(frames=(2, 9, 16, 16, 3), latents=(2, 16, 3, 2, 2))
def motif_video_batches() -> tuple[Pipeline, MakeKwargs]:
    """:func:`motif_video`'s pipe making 2 videos (``num_videos_per_prompt`` 2) with ``vae_batch_size`` 1:
    two ``vae.decode`` calls of [1, 16, 3, 2, 2], one a video, joined along the batch → ``.frames``
    [2, 9, 16, 16, 3]."""
    pipe, make_kwargs = motif_video()

    def make_batches(**overrides: Any) -> dict[str, Any]:
        return make_kwargs(**{"num_videos_per_prompt": 2, "vae_batch_size": 1, **overrides})

    return pipe, make_batches


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def chronoedit_temporal_reasoning() -> tuple[Pipeline, MakeKwargs]:
    """:func:`chronoedit`'s pipe with temporal reasoning over every step (``num_temporal_reasoning_steps`` 2
    of 2), 9 frames: the latents [1, 16, 3, 2, 2] are never cut, and the pipeline decodes twice, the edit
    (first and last latents, [1, 16, 2, 2, 2] → 5 frames) then the reasoning (the first two, → 5 frames),
    and returns the reasoning's 5 frames and the edit's last 4: ``.frames`` [1, 9, 16, 16, 3]."""
    pipe, make_kwargs = chronoedit()

    def make_reasoning(**overrides: Any) -> dict[str, Any]:
        reasoning = {"enable_temporal_reasoning": True, "num_temporal_reasoning_steps": 2, "num_frames": 9}
        return make_kwargs(**{**reasoning, **overrides})

    return pipe, make_reasoning


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def motif_video_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Motif-Video image to video (``tiny_wan21``; diffusers' test transformer with its image-embedding width
    and its default ``AdaptiveProjectedGuidance`` guider; the call has no ``guidance_scale``): a 16×16 noise
    image, 16×16, 9 frames. The image is ``vae.encode``d as the first latent frame's condition (the other
    frames' condition is zero, the mask marks frame 0); with no text encoder there is no SigLIP image
    embedding. One ``vae.decode`` of the de-normalized [1, 16, 3, 2, 2] → 9 frames (no ``vae_batch_size``
    here: the batch is decoded in one call). ``prompt`` has no default: the call passes ``None`` beside
    the embeddings. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = pipeline(
        MotifVideoImage2VideoPipeline,
        vae=tiny_wan21(),
        transformer=seeded(MotifVideoTransformer3DModel, {**_MOTIF_TRANSFORMER, "image_embed_dim": 4}),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        guider=AdaptiveProjectedGuidance(),
        feature_extractor=None,
    )
    prompt = prompt_pair(WAN_TEXT_DIM, mask_dtype=torch.long)
    return pipe, call_kwargs(prompt, image=16, prompt=None, height=16, width=16, num_frames=9)


#: diffusers' tests/pipelines/anyflow FAR transformer: :data:`_ANYFLOW_TRANSFORMER` with the FAR chunking
#: (full attention over the last 3 chunks, 4×4-compressed patches before them).
_ANYFLOW_FAR_TRANSFORMER: dict[str, Any] = {
    **_ANYFLOW_TRANSFORMER,
    "compressed_patch_size": (1, 4, 4),
    "full_chunk_limit": 3,
}


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def anyflow_far() -> tuple[Pipeline, MakeKwargs]:
    """AnyFlow FAR text to video (frame-autoregressive, flow-map distilled Wan 2.1: ``tiny_wan21``,
    diffusers' test FAR transformer and ``FlowMapEulerDiscreteScheduler``): 16×16, 9 frames,
    ``chunk_partition`` [1, 1, 1] → 3 chunks of 1 latent frame, each denoised in 2 steps attending to the
    KV cache of the ones before; the chunks are joined and permuted back after the loop, then one
    ``vae.decode`` of [1, 16, 3, 2, 2] → 9 frames. The ``"latent"`` output is [1, 16, 3, 2, 2]. About 0.2 s
    a call on 2 CPU cores; no audio."""
    pipe = pipeline(
        AnyFlowFARPipeline,
        vae=tiny_wan21(),
        transformer=seeded(AnyFlowFARTransformer3DModel, _ANYFLOW_FAR_TRANSFORMER),
        scheduler=FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0),
    )
    return pipe, video_kwargs(16, 6.0, prompt_pair(WAN_TEXT_DIM), chunk_partition=[1, 1, 1])
