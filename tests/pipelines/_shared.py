"""What every family module of :mod:`tests.pipelines` builds with: the index, seeded parts, call kwargs.

- :func:`builder` registers a builder in the index (:data:`BUILDERS`, :data:`EXPECTED`, :data:`AUDIO`,
  :data:`CORE`) with its output shapes, written beside it, and caches it: built once per process.
- :func:`seeded` and :func:`pipeline` make the same random weights and the same pipe every build;
  :func:`unet_config`, the config of a diffusers test UNet; :func:`word_tokenizer`, the tokenizer of a
  pipeline that tokenizes its prompt itself.
- :func:`call_kwargs` and :func:`video_kwargs` make ``make_kwargs``: a fresh generator and fresh tensors
  every call, then the caller's overrides, then what the pipeline makes of them (``finish``).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import PIL.Image
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

#: ``make_kwargs(**overrides)``: one call's keyword arguments, with a fresh seeded generator.
MakeKwargs = Callable[..., dict[str, Any]]
#: A diffusers ``DiffusionPipeline`` or ``ModularPipeline`` instance (diffusers' lazy exports type poorly).
Pipeline = Any
Builder = Callable[[], tuple[Pipeline, MakeKwargs]]
#: Keyword arguments of one call's prompt: a fresh set of embedding tensors.
Prompt = Callable[[], dict[str, Any]]
#: Changes one call's kwargs in place once the overrides are in: the inputs a pipeline makes from them.
Finish = Callable[[dict[str, Any]], object]

_T = TypeVar("_T")

TEXT_TOKENS = 16  # prompt-embedding sequence length of every family


# ---------------------------------------------------------------------------------------------------------
# The index
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """Output shapes of one builder's pipeline called with its default kwargs."""

    frames: tuple[int, ...]  # ``.frames`` with output_type="np": [batch, frames, height, width, 3]
    latents: tuple[int, ...]  # ``.frames`` with output_type="latent", in the family's own layout


@dataclass(frozen=True)
class ExpectedAudio:
    """The soundtrack of one builder's pipeline called with its default kwargs."""

    shape: tuple[int, ...]  # the waveform: [batch, channels, samples], float32
    sample_rate: int  # what streamvae muxes it at (LTX-2: the vocoder's output rate)
    latents: tuple[int, ...] | None  # the audio latents with output_type="latent" (None: no such output)


#: Builder name → builder; each builds its pipeline once per process (do not mutate what it returns).
BUILDERS: dict[str, Builder] = {}
#: Builder name → output shapes with the builder's default kwargs.
EXPECTED: dict[str, Expected] = {}
#: Builder name → its soundtrack with the builder's default kwargs, for the builders that make one.
AUDIO: dict[str, ExpectedAudio] = {}
#: The core builders: the first families' plain text- and image-to-video calls (Wan 2.1 / 2.2,
#: HunyuanVideo, LTX-Video, CogVideoX). tests/test_generate.py decodes their latents itself and
#: tests/test_tiny_pipelines.py checks their shapes; tests/test_generate_every.py checks every other builder.
CORE: dict[str, Builder] = {}


def builder(
    *,
    frames: tuple[int, ...],
    latents: tuple[int, ...],
    audio: ExpectedAudio | None = None,
    core: bool = False,
    needs: str | None = None,
) -> Callable[[Builder], Builder]:
    """Put the decorated function in the index under its own name, cached (``functools.cache``: building a
    pipeline costs more than running it), with the shapes its default kwargs give (:class:`Expected`) and,
    if it makes one, its soundtrack's. A builder whose pipeline ``needs`` a module that is not installed
    stays out of the index."""

    def register(build: Builder) -> Builder:
        name = build.__name__
        assert name not in BUILDERS, f"two builders are named {name}"
        cached = functools.cache(build)
        if needs is not None and importlib.util.find_spec(needs) is None:
            return cached
        BUILDERS[name] = cached
        EXPECTED[name] = Expected(frames=frames, latents=latents)
        if audio is not None:
            AUDIO[name] = audio
        if core:
            CORE[name] = cached
        return cached

    return register


# ---------------------------------------------------------------------------------------------------------
# Seeded models and the pipe
# ---------------------------------------------------------------------------------------------------------


def seeded(model_class: Callable[..., _T], config: Mapping[str, Any], seed: int = 0) -> _T:
    """``model_class(**config)`` right after ``torch.manual_seed(seed)``: the same random weights every
    build."""
    torch.manual_seed(seed)
    return model_class(**config)


def word_tokenizer(words: Sequence[str], *, split: bool = True, **special: Any) -> PreTrainedTokenizerFast:
    """A tokenizer of a few ``words`` made in memory (no hub download): each word one token, its index in
    ``words``; any other word ``[UNK]`` (one of ``words``). With ``split`` the text is split on whitespace
    first; without it, the whole text is one word (``[UNK]`` unless it is one of ``words``). ``special`` goes
    to ``PreTrainedTokenizerFast`` (``pad_token``, ``eos_token``, ``padding_side``...)."""
    vocabulary = Tokenizer(WordLevel({word: index for index, word in enumerate(words)}, unk_token="[UNK]"))
    if split:
        vocabulary.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=vocabulary, unk_token="[UNK]", **special)


def unet_config(
    block_out_channels: tuple[int, ...],
    down_block_types: tuple[str, ...],
    up_block_types: tuple[str, ...],
    **extra: Any,
) -> dict[str, Any]:
    """The config of one of diffusers' test UNets (2-D, 3-D, spatio-temporal): its blocks, then what they
    all have, 4 latent channels in and out, sample size 32 and 2 layers a block, unless ``extra`` says
    otherwise, then the rest of ``extra``."""
    return {
        "block_out_channels": block_out_channels,
        "layers_per_block": 2,
        "sample_size": 32,
        "in_channels": 4,
        "out_channels": 4,
        "down_block_types": down_block_types,
        "up_block_types": up_block_types,
        **extra,
    }


def eval_mode(pipe: Pipeline) -> Pipeline:
    """Every model of ``pipe`` in eval mode, as ``from_pretrained`` leaves it."""
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


def pipeline(pipeline_class: Callable[..., Pipeline], **components: Any) -> Pipeline:
    """``pipeline_class(**components)`` with every text encoder and tokenizer ``None`` (the calls pass prompt
    embeddings), every model in eval mode and no progress bar."""
    parameters = inspect.signature(pipeline_class).parameters
    no_text = {name: None for name in parameters if name.startswith(("text_encoder", "tokenizer"))}
    pipe = eval_mode(pipeline_class(**no_text, **components))
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---------------------------------------------------------------------------------------------------------
# Seeded inputs and the kwargs of a call
# ---------------------------------------------------------------------------------------------------------


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def noise_image(size: int) -> PIL.Image.Image:
    """A seeded RGB noise image ``size`` × ``size`` (a new object every call: the pipeline may keep it)."""
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def noise_frames(count: int, size: int, seed: int) -> list[PIL.Image.Image]:
    """``count`` seeded RGB noise frames ``size`` × ``size`` (new objects every call)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    return [PIL.Image.fromarray(frame) for frame in pixels]


def prompt_pair(dim: int, mask_dtype: torch.dtype | None = None) -> Prompt:
    """Prompt and negative-prompt embeddings ``[1, 16, dim]`` (seeds 1 and 2), each followed by an all-ones
    attention mask of ``mask_dtype`` when one is given."""

    def prompt() -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for prefix, seed in (("", 1), ("negative_", 2)):
            kwargs[f"{prefix}prompt_embeds"] = randn(1, TEXT_TOKENS, dim, seed=seed)
            if mask_dtype is not None:
                kwargs[f"{prefix}prompt_attention_mask"] = torch.ones(1, TEXT_TOKENS, dtype=mask_dtype)
        return kwargs

    return prompt


def call_kwargs(
    embeddings: Prompt, *, image: int | None = None, finish: Finish | None = None, **fixed: Any
) -> MakeKwargs:
    """``make_kwargs`` of one call: its ``fixed`` options, then ``embeddings()`` (and, given an ``image``
    size, a noise ``image`` of that size), a new generator and 2 steps, then the overrides, then ``finish``.

    Tensors and images are rebuilt every call so a caller that edits one in place cannot change the next.
    """

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        kwargs = {**fixed, **embeddings(), **({"image": noise_image(image)} if image is not None else {})}
        kwargs |= {"generator": torch.Generator().manual_seed(0), "num_inference_steps": 2}
        kwargs.update(overrides)
        if finish is not None:
            finish(kwargs)
        return kwargs

    return make_kwargs


def video_kwargs(
    size: int,
    guidance_scale: float,
    embeddings: Prompt,
    *,
    image: bool = False,
    finish: Finish | None = None,
    **fixed: Any,
) -> MakeKwargs:
    """:func:`call_kwargs` of a ``size`` × ``size``, 9-frame call at ``guidance_scale`` (``fixed`` may change
    any of them), with a ``size`` × ``size`` ``image`` if ``image``."""
    options = {"height": size, "width": size, "num_frames": 9, "guidance_scale": guidance_scale, **fixed}
    return call_kwargs(embeddings, image=size if image else None, finish=finish, **options)


def noise_video(key: str, size: int) -> Finish:
    """A ``finish`` for a call that takes a video instead of a frame count: ``num_frames`` becomes ``key``, a
    seeded noise video of that many ``size`` × ``size`` frames."""

    def finish(kwargs: dict[str, Any]) -> None:
        kwargs.setdefault(key, noise_frames(kwargs.pop("num_frames"), size, seed=3))

    return finish
