"""Helios builders (HeliosPipeline, HeliosPyramidPipeline): autoregressive chunks of 9 latent frames, each
decoded alone inside the chunk loop (so also with ``output_type="latent"``); the decoded chunks are
concatenated and trimmed to ``1 + 4k`` frames.

diffusers' own tiny Helios test config, with the Wan 2.1 VAE ``tiny_wan21`` (its test VAE's layout).
:data:`HELIOS_TRANSFORMER` and :data:`HELIOS_FRAMES` also serve the modular Helios builder.
"""

from __future__ import annotations

from typing import Any

from diffusers import HeliosPipeline, HeliosPyramidPipeline, HeliosScheduler, HeliosTransformer3DModel

from tests._vaes import tiny_wan21
from tests.pipelines._shared import MakeKwargs, Pipeline, builder, pipeline, prompt_pair, seeded, video_kwargs
from tests.pipelines.wan import WAN21_TRANSFORMER, WAN_TEXT_DIM

#: diffusers' tiny Helios transformer (tests/pipelines/helios): the tiny Wan one with Helios's positions and
#: history memory.
HELIOS_TRANSFORMER: dict[str, Any] = {
    **{key: value for key, value in WAN21_TRANSFORMER.items() if key != "rope_max_seq_len"},
    "rope_dim": (4, 4, 4),
    "has_multi_term_memory_patch": True,
    "guidance_cross_attn": True,
    "zero_history_timestep": True,
    "is_amplify_history": False,
}
#: 2 chunks: each chunk is ``num_latent_frames_per_chunk`` 9 latents = a 33-frame window, and the call runs
#: ``ceil(num_frames / 33)`` chunks (67–99 frames give 3).
HELIOS_FRAMES = 66


def _helios(pipeline_class: type[Any], scheduler: HeliosScheduler) -> Pipeline:
    return pipeline(
        pipeline_class,
        vae=tiny_wan21(),  # diffusers' Helios test VAE is this layout (base_dim 3, z_dim 16)
        transformer=seeded(HeliosTransformer3DModel, HELIOS_TRANSFORMER),
        scheduler=scheduler,
    )


@builder(frames=(1, 65, 16, 16, 3), latents=(1, 16, 18, 2, 2))
def helios() -> tuple[Pipeline, MakeKwargs]:
    """Helios text-to-video (diffusers' own test config, Wan 2.1 VAE ``tiny_wan21``): 16×16, ``num_frames``
    66 → 2 autoregressive chunks of 9 latent frames, each decoded alone (``vae.decode`` of [1, 16, 9, 2, 2],
    33 frames, twice); the 66 decoded frames are cut to 65. ``num_frames`` 67 to 99 gives 3 chunks and 97
    frames (the call makes whole chunks and never cuts to ``num_frames``). The ``"latent"`` output is every
    chunk's latents: [1, 16, 18, 2, 2].
    """
    scheduler = HeliosScheduler(stage_range=[0, 1], stages=1, use_dynamic_shifting=True)
    pipe = _helios(HeliosPipeline, scheduler)
    return pipe, video_kwargs(16, 5.0, prompt_pair(WAN_TEXT_DIM), num_frames=HELIOS_FRAMES)


def _no_steps(kwargs: dict[str, Any]) -> None:
    del kwargs["num_inference_steps"]  # the pyramid call counts its steps by stage


@builder(frames=(1, 65, 32, 32, 3), latents=(1, 16, 18, 4, 4))
def helios_pyramid() -> tuple[Pipeline, MakeKwargs]:
    """Helios pyramid text-to-video: 2 pyramid stages of 1 step each (latents 2×2, then 4×4), 32×32,
    ``num_frames`` 66 → 2 chunks, each decoded alone (``vae.decode`` of [1, 16, 9, 4, 4], twice) → 65 frames;
    ``"latent"`` output [1, 16, 18, 4, 4].

    The call has no ``num_inference_steps`` (``make_kwargs`` drops it; override
    ``pyramid_num_inference_steps_list`` instead). The scheduler's ``gamma`` is 0.3, not the default 1/3:
    the block noise added when a stage upsamples has the covariance ``(1+γ)I − γJ`` over 2×2 patches,
    singular at γ = 1/3 (eigenvalue 1 − 3γ), and CPU LAPACK's Cholesky rejects it in float32.
    """
    scheduler = HeliosScheduler(stage_range=[0, 0.5, 1], stages=2, gamma=0.3, use_dynamic_shifting=True)
    pipe = _helios(HeliosPyramidPipeline, scheduler)
    fixed: dict[str, Any] = {"num_frames": HELIOS_FRAMES, "pyramid_num_inference_steps_list": [1, 1]}
    return pipe, video_kwargs(32, 5.0, prompt_pair(WAN_TEXT_DIM), finish=_no_steps, **fixed)
