"""A diffusers video pipeline in one call, its decode streamed into MP4s.

``await generate_mp4(pipe, fps=16, prompt_embeds=…, num_frames=81, generator=…)`` runs the pipeline and
returns one MP4 per video; ``async with stream_generation(pipe, fps=16, …) as streams:`` gives their bytes
as they are written. The frames and the sound are exactly the pipeline's own (``pipe(…,
output_type="np")``): the pipeline runs its own code, and streamvae stands in for its ``vae.decode`` —
decoding the latents of a pipeline that decodes once, or each clip of one that decodes clip by clip, as it
asks. docs/pipelines.md lists every diffusers video pipeline with its verdict. See :func:`generate_mp4`.
Importing this package does not import diffusers.
"""

from __future__ import annotations

from streamvae.pipelines._generate import generate_mp4, stream_generation

__all__ = ["generate_mp4", "stream_generation"]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
