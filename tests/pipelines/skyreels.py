"""SkyReels-V2 builders: text and image to video, and diffusion forcing (short and long mode, from an image,
extending a video).

Every one decodes once; the long mode runs several diffusion-forcing iterations on overlapping latent
windows first, and extending a video puts the input video's own (preprocessed) frames before the decoded
ones. Each is
``tiny_wan21`` with diffusers' tiny SkyReels-V2 transformer (the tiny Wan one, 16 channels).
"""

from __future__ import annotations

import functools
from typing import Any

from diffusers import (
    SkyReelsV2DiffusionForcingImageToVideoPipeline,
    SkyReelsV2DiffusionForcingPipeline,
    SkyReelsV2DiffusionForcingVideoToVideoPipeline,
    SkyReelsV2ImageToVideoPipeline,
    SkyReelsV2Pipeline,
    SkyReelsV2Transformer3DModel,
)

from tests._vaes import tiny_wan21
from tests.pipelines._shared import (
    Finish,
    MakeKwargs,
    Pipeline,
    builder,
    noise_frames,
    pipeline,
    prompt_pair,
    seeded,
    video_kwargs,
)
from tests.pipelines.wan import CLIP_VISION, WAN21_TRANSFORMER, WAN_TEXT_DIM, clip_image_encoder, flow_unipc


def _skyreels(pipeline_class: Any, transformer: dict[str, Any] | None = None, **components: Any) -> Pipeline:
    """A tiny SkyReels-V2 pipeline: ``tiny_wan21``, diffusers' tests' UniPC scheduler with the flow
    prediction of the released checkpoints (flow shift 5); ``transformer`` adds to its transformer's
    config."""
    return pipeline(
        pipeline_class,
        vae=tiny_wan21(),
        transformer=seeded(SkyReelsV2Transformer3DModel, {**WAN21_TRANSFORMER, **(transformer or {})}),
        scheduler=flow_unipc(5.0),
        **components,
    )


def _kwargs(**options: Any) -> MakeKwargs:
    """The 16×16, 9-frame kwargs at guidance 6.0 of every SkyReels-V2 call."""
    return video_kwargs(16, 6.0, prompt_pair(WAN_TEXT_DIM), **options)


# ---------------------------------------------------------------------------------------------------------
# Text / image to video
# ---------------------------------------------------------------------------------------------------------


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def skyreels_v2() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 text to video (``tiny_wan21``): 16×16, 9 frames → one ``vae.decode`` of
    [1, 16, 3, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    return _skyreels(SkyReelsV2Pipeline), _kwargs()


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def skyreels_v2_i2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 image to video (Wan 2.1 I2V's layout: CLIP image embeddings from a tiny vision tower, 36
    input channels = noise, mask, condition): a 16×16 image, 9 frames → ``vae.encode`` of the image and 8
    zero frames, then one ``vae.decode`` of [1, 16, 3, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _skyreels(
        SkyReelsV2ImageToVideoPipeline,
        transformer={"in_channels": 16 + 4 + 16, "image_dim": CLIP_VISION["hidden_size"]},
        **clip_image_encoder(),
    )
    return pipe, _kwargs(image=True)


# ---------------------------------------------------------------------------------------------------------
# Diffusion forcing: short mode, long mode (overlapping iterations, one decode), from an image or a video
# ---------------------------------------------------------------------------------------------------------


@functools.cache  # both text-to-video modes share one pipe
def _diffusion_forcing() -> Pipeline:
    return _skyreels(SkyReelsV2DiffusionForcingPipeline)


def _forcing_kwargs(finish: Finish | None = None, **options: Any) -> MakeKwargs:
    """:func:`_kwargs` with ``prompt`` None (this ``__call__`` gives it no default)."""
    return _kwargs(prompt=None, finish=finish, **options)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def skyreels_v2_df() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing, short mode (``num_frames`` ≤ ``base_num_frames``, synchronous): 16×16,
    9 frames → one iteration, one ``vae.decode`` of [1, 16, 3, 2, 2]."""
    return _diffusion_forcing(), _forcing_kwargs(base_num_frames=9)


@builder(frames=(1, 17, 16, 16, 3), latents=(1, 16, 5, 2, 2))
def skyreels_v2_df_long() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing, long mode: 16×16, ``num_frames`` 17 (5 latents), ``base_num_frames`` 9
    (windows of 3 latents), ``overlap_history`` 5 (2 latents kept) → 3 iterations (3 + 1 + 1 new latents);
    the accumulated latents are decoded once at the end, ``vae.decode`` of [1, 16, 5, 2, 2] → 17 frames.
    ``num_frames=13`` gives 2 iterations.
    """
    return _diffusion_forcing(), _forcing_kwargs(num_frames=17, base_num_frames=9, overlap_history=5)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def skyreels_v2_df_i2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing from an image, short mode (``base_num_frames`` 9): the image's latent
    is the first of [1, 16, 3, 2, 2]; one ``vae.decode`` of them → 9 frames. With ``last_image`` the last
    image's latent is appended for the denoising and dropped before the decode. About 0.1 s a call on 2 CPU
    cores; no audio."""

    def image(kwargs: dict[str, Any]) -> None:
        kwargs.setdefault("image", noise_frames(1, 16, seed=3)[0])

    pipe = _skyreels(SkyReelsV2DiffusionForcingImageToVideoPipeline)
    return pipe, _forcing_kwargs(image, base_num_frames=9)


@builder(frames=(1, 16, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def skyreels_v2_df_v2v() -> tuple[Pipeline, MakeKwargs]:
    """SkyReels-V2 diffusion forcing, extending a video: a 7-frame 16×16 noise video, ``num_frames`` 9 new
    frames, ``overlap_history`` 5 (the video's last 5 frames, 2 latents, are encoded as the prefix),
    ``base_num_frames`` 9 → one iteration; one ``vae.decode`` of [1, 16, 3, 2, 2] (the 2 prefix latents and
    1 new one → 9 frames), which the pipeline appends to the 7 input frames themselves (preprocessed, not
    re-decoded): ``.frames`` [1, 7 + 9, 16, 16, 3]. Its plan sends those 7 preprocessed frames first
    (``lead_frames``), then the decode. About 0.1 s a call on 2 CPU cores; no audio."""

    def video(kwargs: dict[str, Any]) -> None:
        kwargs.setdefault("video", noise_frames(7, 16, seed=3))

    pipe = _skyreels(SkyReelsV2DiffusionForcingVideoToVideoPipeline)
    return pipe, _forcing_kwargs(video, base_num_frames=9, overlap_history=5)
