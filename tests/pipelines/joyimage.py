"""JoyImage Edit (AutoencoderKLWan): image editing, each image a one-frame video.

Both snap the output size to a bucket of JoyImage's 1024-pixel table (``find_best_bucket``: 512 pixels a
side at least), too large for a CPU test; the builders give their pipe an image processor that keeps the
call's ``height`` and ``width`` (diffusers' own tests patch ``find_best_bucket`` to the same end). The
calls pass prompt embeddings with their masks (no Qwen3-VL text encoder or processor).

- ``JoyImageEditPipeline`` denoises the reference image's latent and the target's side by side
  (``[B, 2, C, 1, h, w]``), decodes both in one ``vae.decode`` of the flattened ``[2B, C, 1, h, w]`` and
  keeps the target: streamvae decodes only the targets' latents.
- ``JoyImageEditPlusPipeline`` formats ``prompt`` into its chat template even when ``prompt_embeds`` are
  given (``len(None)``: diffusers 0.42.1), and refuses both at once: its calls need a ``prompt``, and so its
  Qwen3-VL text encoder and processor. Its builder makes them tiny in memory (a word-level tokenizer, a
  one-layer Qwen3-VL, a Qwen2-VL image processor that makes each image one merged token), as diffusers'
  own test does from a hub checkpoint a test cannot fetch. It decodes each entry's target alone, a
  ``vae.decode`` an entry.
"""

from __future__ import annotations

from typing import Any

import PIL.Image
import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    JoyImageEditPipeline,
    JoyImageEditPlusPipeline,
    JoyImageEditPlusTransformer3DModel,
    JoyImageEditTransformer3DModel,
)
from diffusers.pipelines.joyimage.image_processor import JoyImageEditImageProcessor
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from tests._vaes import tiny_wan21
from tests.pipelines._shared import (
    TEXT_TOKENS,
    MakeKwargs,
    Pipeline,
    builder,
    call_kwargs,
    eval_mode,
    noise_frames,
    pipeline,
    randn,
    seeded,
    word_tokenizer,
)

_JOY_SIZE = 16
_JOY_TEXT_DIM = 16
#: diffusers' tiny JoyImage Edit transformer (tests/pipelines/joyimage), on tiny_wan21's 16 channels
_JOY_TRANSFORMER: dict[str, Any] = {
    "patch_size": [1, 2, 2],
    "in_channels": 16,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "text_dim": _JOY_TEXT_DIM,
    "num_layers": 1,
    "rope_dim_list": [4, 6, 6],
    "theta": 256,
}


class _CallSize(JoyImageEditImageProcessor):
    """JoyImage's image processor with the call's ``height`` and ``width`` kept as they are (else the
    image's size), not snapped to a bucket of 512 pixels or more."""

    def get_default_height_width(
        self, image: PIL.Image.Image, height: int | None = None, width: int | None = None
    ) -> tuple[int, int]:
        if height is not None and width is not None:
            return height, width
        first = image[0] if isinstance(image, list) else image
        return first.size[1], first.size[0]


def _joy_prompt() -> dict[str, Any]:
    """Prompt and negative-prompt embeddings [1, 16, 16] (seeds 1, 2) with all-ones masks."""
    kwargs: dict[str, Any] = {}
    for prefix, seed in (("", 1), ("negative_", 2)):
        kwargs[f"{prefix}prompt_embeds"] = randn(1, TEXT_TOKENS, _JOY_TEXT_DIM, seed=seed)
        kwargs[f"{prefix}prompt_embeds_mask"] = torch.ones(1, TEXT_TOKENS, dtype=torch.long)
    return kwargs


def _seed_global_rng(kwargs: dict[str, Any]) -> None:
    """Seed torch's global generator as the kwargs are made: the pipeline samples the reference image's
    latent with ``latent_dist.sample()`` and no generator, so two calls see the same draw only this way."""
    torch.manual_seed(0)


def _joy() -> Pipeline:
    pipe = pipeline(
        JoyImageEditPipeline,
        transformer=seeded(JoyImageEditTransformer3DModel, _JOY_TRANSFORMER),
        vae=tiny_wan21(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        processor=None,
    )
    pipe.vae_image_processor = _CallSize(vae_scale_factor=pipe.vae_scale_factor_spatial)
    return pipe


# an image pipeline: ``.images`` [1, 16, 16, 3], here a one-frame video; ``latents``: ``.images`` with
# output_type="latent", the target's latent frame [1, 16, 2, 2] (its own slicing of [1, 2, 16, 1, 2, 2])
@builder(frames=(1, 1, 16, 16, 3), latents=(1, 16, 2, 2))
def joyimage_edit() -> tuple[Pipeline, MakeKwargs]:
    """JoyImage Edit (diffusers' tiny transformer, ``tiny_wan21``, guidance 4.0 with its norm rescaling): a
    16×16 noise image ``vae.encode``d as the reference slot (sampled from torch's global generator, which
    ``make_kwargs`` seeds), the target slot denoised beside it; one ``vae.decode`` of both,
    [2, 16, 1, 2, 2], the target kept → ``.images`` [1, 16, 16, 3]."""
    pipe = _joy()
    return pipe, call_kwargs(
        _joy_prompt,
        image=_JOY_SIZE,
        finish=_seed_global_rng,
        height=_JOY_SIZE,
        width=_JOY_SIZE,
        guidance_scale=4.0,
    )


# -- JoyImage Edit Plus: its Qwen3-VL text encoder and processor, tiny and made in memory --

#: the Qwen chat markers and vision tokens the pipeline's template and Qwen3-VL's processor use
_QWEN_SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def _qwen_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer of a few words made in memory (no hub download), with Qwen's chat markers and vision
    tokens; every other word is ``[UNK]``."""
    words = ["[UNK]", "<|endoftext|>", *_QWEN_SPECIAL, "user", "assistant", "system", "combine", "images"]
    return word_tokenizer(
        words, eos_token="<|endoftext|>", pad_token="<|endoftext|>", additional_special_tokens=_QWEN_SPECIAL
    )


class _ImagesOnly(Qwen3VLProcessor):
    """Qwen3-VL's processor without its video processor: that one is torchvision's (PyPI has torchvision
    only as a CUDA build that does not import beside a CPU torch), and the pipeline gives it no video."""

    def __init__(
        self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def _qwen3_vl(tokenizer: PreTrainedTokenizerFast) -> Qwen3VLForConditionalGeneration:
    """A seeded one-layer Qwen3-VL over ``tokenizer``'s words: 16-wide text (JoyImage's ``text_dim``), a
    one-block vision tower of 16-pixel patches, merged 2×2."""
    token_ids = {
        f"{name}_token_id": tokenizer.convert_tokens_to_ids(f"<|{name}|>")
        for name in ("vision_start", "vision_end")
    }
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": _JOY_TEXT_DIM,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [1, 1, 2],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": _JOY_TEXT_DIM,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        **token_ids,
    )
    return seeded(Qwen3VLForConditionalGeneration, {"config": config})


def _no_embeddings() -> dict[str, Any]:
    return {}  # the pipeline encodes its prompt itself: it takes no embeddings with one


def _reference_images(kwargs: dict[str, Any]) -> None:
    kwargs.setdefault("images", noise_frames(2, _JOY_SIZE, seed=4))


# an image pipeline: ``.images`` [1, 16, 16, 3], here a one-frame video; ``latents``: ``.images`` with
# output_type="latent", its patches [batch, patches, C, pt, ph, pw]: the target's and each reference's one
@builder(frames=(1, 1, 16, 16, 3), latents=(1, 3, 16, 1, 2, 2))
def joyimage_edit_plus() -> tuple[Pipeline, MakeKwargs]:
    """JoyImage Edit Plus (diffusers' tiny transformer, ``tiny_wan21``, guidance 4.0 with its norm
    rescaling; the in-memory Qwen3-VL, its tokenizer and processor, each 16×16 image one merged token): two
    16×16 noise reference images, each ``vae.encode``d (its latent's mode), and "combine the images" (the
    negative prompt the pipeline's blank one); the target denoised beside them, then one ``vae.decode`` of
    the target, [1, 16, 1, 2, 2] → ``.images`` [1, 16, 16, 3]."""
    tokenizer = _qwen_tokenizer()
    pixels = 32 * 32  # each 16×16 image resized to 32×32: 2×2 patches, one token once merged
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=pixels, max_pixels=pixels
    )
    pipe = eval_mode(
        JoyImageEditPlusPipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(),
            vae=tiny_wan21(),
            text_encoder=_qwen3_vl(tokenizer),
            tokenizer=tokenizer,
            transformer=seeded(JoyImageEditPlusTransformer3DModel, _JOY_TRANSFORMER),
            processor=_ImagesOnly(image_processor=image_processor, tokenizer=tokenizer),
        )
    )
    pipe.set_progress_bar_config(disable=True)
    pipe.image_processor = _CallSize(vae_scale_factor=pipe.vae_scale_factor_spatial)
    return pipe, call_kwargs(
        _no_embeddings,
        finish=_reference_images,
        prompt="combine the images",
        height=_JOY_SIZE,
        width=_JOY_SIZE,
        guidance_scale=4.0,
    )


def _two_entries(kwargs: dict[str, Any]) -> None:
    first, second, third = noise_frames(3, _JOY_SIZE, seed=4)
    kwargs.setdefault("images", [[first, second], [third]])


# ``latents``: both entries' patches, the second's padded to the first's 3
@builder(frames=(2, 1, 16, 16, 3), latents=(2, 3, 16, 1, 2, 2))
def joyimage_edit_plus_batch() -> tuple[Pipeline, MakeKwargs]:
    """:func:`joyimage_edit_plus`'s pipe with two prompts, the first with two reference images and the
    second with one: the entries denoised together (the second's patches padded), then a ``vae.decode`` of
    each entry's target, [1, 16, 1, 2, 2] each → ``.images`` [2, 16, 16, 3]."""
    pipe, _ = joyimage_edit_plus()
    return pipe, call_kwargs(
        _no_embeddings,
        finish=_two_entries,
        prompt=["combine the images", "images"],
        height=_JOY_SIZE,
        width=_JOY_SIZE,
        guidance_scale=4.0,
    )
