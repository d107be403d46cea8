"""Tiny seeded diffusers video pipelines for tests: the real pipeline classes, random weights, CPU float32.

A builder returns ``(pipe, make_kwargs)``. ``make_kwargs(**overrides)`` returns the keyword arguments of
one call, ``pipe(**make_kwargs(), output_type="np")``: 2 inference steps, a few tiny frames, prompt
embeddings instead of a prompt (no pipeline has a text encoder or tokenizer) and a fresh
``torch.Generator().manual_seed(0)`` every time, because a call consumes its generator and two calls must
see the same noise to give the same video (and the same sound). ``overrides`` replace or add keys
(``num_frames=17``). A modular pipeline is called with ``output=[...]`` instead (:mod:`.modular`).

A pipeline is built once per process (``functools.cache``): building one costs more than running it.
Callers must not mutate the cached pipe or its components (``vae.enable_tiling()``, attribute patches,
hooks, ``.to(...)``); a test that needs to change one builds its own from the same parts, or undoes the
change before it returns (``monkeypatch`` does).

The index, by builder name: :data:`BUILDERS`; :data:`EXPECTED`, the shapes of the default call's
``.frames`` with ``output_type="np"`` (``[batch, frames, height, width, 3]``, values in [0, 1]) and with
``output_type="latent"`` (each family's own layout: Wan and HunyuanVideo ``[B, C, T, h, w]``, LTX packed
``[B, T·h·w, C]``, CogVideoX frames-first ``[B, T, C, h, w]``, Kandinsky 5 channels-last); :data:`AUDIO`,
the soundtrack of those that make one; :data:`CORE`, the builders tests/test_generate.py runs.

One module a family, each builder with its shapes beside it (``@builder``): :mod:`.wan` (and the pipelines
built on Wan: ChronoEdit, Lucy Edit, Motif-Video, AnyFlow), :mod:`.skyreels`, :mod:`.helios`,
:mod:`.sana_video`, :mod:`.hunyuan` (HunyuanVideo, Framepack, HunyuanVideo 1.5), :mod:`.kandinsky`,
:mod:`.ltx` (LTX-Video, LTX-2), :mod:`.cogvideox` (and ConsisID), :mod:`.mochi`, :mod:`.allegro`,
:mod:`.easyanimate`, :mod:`.stable_video_diffusion`, and :mod:`.modular`, every modular pipeline. What
several of them build with is in :mod:`._shared`. The VAEs are :mod:`tests._vaes`' wherever one fits
(streamvae's adapters are checked exact on them); the other models are diffusers' own tiny test configs
(``get_dummy_components`` of tests/pipelines/<family> and of the model tests), seeded, with default
initialisation.
"""

from __future__ import annotations

# Each family module registers its builders in the index as it is imported.
from tests.pipelines import (  # noqa: F401
    allegro,
    bria,
    cogvideox,
    cosmos,
    easyanimate,
    helios,
    hunyuan,
    image_vae,
    joyimage,
    kandinsky,
    ltx,
    mochi,
    modular,
    sana_video,
    skyreels,
    stable_video_diffusion,
    wan,
)
from tests.pipelines._shared import (
    AUDIO,
    BUILDERS,
    CORE,
    EXPECTED,
    Builder,
    Expected,
    ExpectedAudio,
    MakeKwargs,
)

__all__ = ["AUDIO", "BUILDERS", "CORE", "EXPECTED", "Builder", "Expected", "ExpectedAudio", "MakeKwargs"]
