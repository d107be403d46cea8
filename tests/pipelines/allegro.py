"""The Allegro builder: text to video with :mod:`tests._vaes`' ``tiny_allegro``, whose VAE decodes only in
tiles, once after the loop."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AllegroPipeline, AllegroTransformer3DModel, DDIMScheduler

from tests._vaes import tiny_allegro
from tests.pipelines._shared import MakeKwargs, Pipeline, builder, pipeline, prompt_pair, seeded, video_kwargs

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


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 4, 3, 8, 8))
def allegro() -> tuple[Pipeline, MakeKwargs]:
    """Allegro text to video (``tiny_allegro``: 4 channels, 4× in time, 2× in space, tiling on with small
    tiles): 16×16, 9 frames → ``.frames`` [1, 9, 16, 16, 3]. One ``vae.decode(latents / scaling_factor)``
    (``.sample`` [1, 12, 3, 16, 16], frames first) of [1, 4, 3, 8, 8]: 3 latents decode to 12 frames, which
    the pipeline cuts to ``num_frames``. ``output_type="latent"`` gives [1, 4, 3, 8, 8].

    Keep the latent frame count odd (``num_frames`` 9, 17, …): these tiles span 3 latent frames every 2, and
    the tiled decode leaves the frames of a latent past the last whole tile black (2 latents: all of them).
    """
    pipe = pipeline(
        AllegroPipeline,
        transformer=seeded(AllegroTransformer3DModel, _ALLEGRO_TRANSFORMER),
        vae=tiny_allegro(),
        scheduler=DDIMScheduler(),
    )
    # negative_prompt defaults to "", which may not come with negative_prompt_embeds
    prompt = prompt_pair(24, mask_dtype=torch.long)
    return pipe, video_kwargs(16, 6.0, prompt, negative_prompt=None)
