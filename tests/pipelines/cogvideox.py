"""CogVideoX builders: CogVideoX 1.0 / 1.5 text and image to video, video to video, CogVideoX-Fun control
and ConsisID; every one decodes once after its loop, its latents frames first ``[B, T, C, h, w]``.

The text-to-video pair keeps diffusers' default initialisation of its VAE (diffusers' tests/pipelines/cogvideo
config); the others use :mod:`tests._vaes`' ``tiny_cogvideox`` (4 channels, 4× in time, 8× in space).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    CogVideoXDDIMScheduler,
    CogVideoXFunControlPipeline,
    CogVideoXImageToVideoPipeline,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
    CogVideoXVideoToVideoPipeline,
    ConsisIDPipeline,
    ConsisIDTransformer3DModel,
)

from tests._vaes import tiny_cogvideox
from tests.pipelines._shared import (
    TEXT_TOKENS,
    Finish,
    MakeKwargs,
    Pipeline,
    builder,
    noise_video,
    pipeline,
    prompt_pair,
    seeded,
    video_kwargs,
)

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
    "max_text_seq_length": TEXT_TOKENS,
}
#: CogVideoX 1.0's attention: 4 heads of 8, sin-cos positions.
_COG_10_HEADS: dict[str, Any] = {"num_attention_heads": 4, "attention_head_dim": 8}
_COG_VAE: dict[str, Any] = {
    "block_out_channels": (8, 8, 8, 8),
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 2,
    "temporal_compression_ratio": 4,
}


def _kwargs(*, image: bool = False, finish: Finish | None = None) -> MakeKwargs:
    """The 16×16, 9-frame kwargs at guidance 6.0 of every CogVideoX call (the learned positions of the image
    to video transformer fix that size)."""
    return video_kwargs(16, 6.0, prompt_pair(_COG_TEXT_DIM), image=image, finish=finish)


# ---------------------------------------------------------------------------------------------------------
# Text to video (CogVideoXPipeline)
# ---------------------------------------------------------------------------------------------------------


def _cogvideox(**transformer_config: Any) -> tuple[Pipeline, MakeKwargs]:
    """A tiny CogVideoX pipeline (diffusers' tests/pipelines/cogvideo config): 16×16, 9 frames."""
    pipe = pipeline(
        CogVideoXPipeline,
        transformer=seeded(CogVideoXTransformer3DModel, {**_COG_TRANSFORMER, **transformer_config}),
        vae=seeded(AutoencoderKLCogVideoX, _COG_VAE),
        scheduler=CogVideoXDDIMScheduler(),
    )
    return pipe, _kwargs()


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 3, 4, 2, 2), core=True)
def cogvideox() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX 1.0 (sin-cos positions, no temporal patches) → latents [1, 3, 4, 2, 2] (frames first)."""
    return _cogvideox(**_COG_10_HEADS)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 4, 2, 2), core=True)
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
# Image / video to video, Fun control, ConsisID
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
    return pipeline(
        pipeline_class,
        transformer=seeded(model_class, transformer),
        vae=tiny_cogvideox(),
        scheduler=CogVideoXDDIMScheduler(),
    )


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 3, 4, 2, 2))
def cogvideox_i2v() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX 1.0 image to video (diffusers' test transformer): a 16×16 image, 9 frames → ``vae.encode``
    of the image, one ``vae.decode(latents / scaling_factor)`` of [1, 4, 3, 2, 2] → 9 frames; the
    ``"latent"`` output is frames-first [1, 3, 4, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio."""
    pipe = _cog(CogVideoXImageToVideoPipeline, CogVideoXTransformer3DModel, _COG_I2V_TRANSFORMER)
    return pipe, _kwargs(image=True)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 4, 2, 2))
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
    return pipe, _kwargs(image=True)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 3, 4, 2, 2))
def cogvideox_v2v() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX video to video (the transformer of :func:`cogvideox`): a 9-frame 16×16 noise video, encoded
    and noised to ``strength`` 0.8 (1 of 2 steps) → one ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames.
    ``make_kwargs`` turns ``num_frames`` into the video (the call has none). About 0.1 s a call on 2 CPU
    cores; no audio."""
    transformer = {**_COG_TRANSFORMER, **_COG_10_HEADS}
    pipe = _cog(CogVideoXVideoToVideoPipeline, CogVideoXTransformer3DModel, transformer)
    return pipe, _kwargs(finish=noise_video("video", 16))


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 3, 4, 2, 2))
def cogvideox_fun_control() -> tuple[Pipeline, MakeKwargs]:
    """CogVideoX-Fun control (diffusers' test transformer: latents and control-video latents in, 4 + 4): a
    9-frame 16×16 noise control video → ``vae.encode`` of it, one ``vae.decode`` of [1, 4, 3, 2, 2] → 9
    frames. ``make_kwargs`` turns ``num_frames`` into the control video. About 0.1 s a call on 2 CPU cores; no
    audio."""
    transformer = {**_COG_TRANSFORMER, "in_channels": 8, **_COG_10_HEADS}
    pipe = _cog(CogVideoXFunControlPipeline, CogVideoXTransformer3DModel, transformer)
    return pipe, _kwargs(finish=noise_video("control_video", 16))


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


def _face_features(kwargs: dict[str, Any]) -> None:
    """What a face model would give ConsisID: ``id_vit_hidden`` [[1, 2, 2]], ``id_cond`` [1, 2]."""
    kwargs.setdefault("id_vit_hidden", [torch.ones(1, 2, 2)])
    kwargs.setdefault("id_cond", torch.ones(1, 2))


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 3, 4, 2, 2), needs="cv2")
def consisid() -> tuple[Pipeline, MakeKwargs]:
    """ConsisID identity-preserving image to video (diffusers' test config; the face features a face
    model would give are passed: ``id_vit_hidden`` [[1, 2, 2]], ``id_cond`` [1, 2]): a 16×16 image, 9
    frames → ``vae.encode`` of the image, one ``vae.decode`` of [1, 4, 3, 2, 2] → 9 frames; ``"latent"``
    output frames-first [1, 3, 4, 2, 2]. About 0.1 s a call on 2 CPU cores; no audio.

    In the index only where OpenCV (``cv2``, not a dependency of streamvae) is installed: without it
    diffusers' ``ConsisIDPipeline`` is a placeholder that raises."""
    pipe = _cog(ConsisIDPipeline, ConsisIDTransformer3DModel, _CONSISID_TRANSFORMER)
    return pipe, _kwargs(image=True, finish=_face_features)
