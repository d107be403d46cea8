"""Bria Fibo and Bria Fibo Edit (AutoencoderKLWan): image pipelines, one ``vae.decode`` of one latent frame.

Both take a prompt string, never embeddings: the builders carry diffusers' tiny SmolLM3 text encoder (its
vocabulary at SmolLM3's default size: the pipelines hardcode the begin-of-text id 128000 for an empty
prompt) and a one-word tokenizer made in memory. Their VAE has Wan 2.2's layout (residual, ``patch_size``
2, 16× in space) with Wan 2.1's 16 latent channels, as Bria's. ``.images`` is ``[B, H, W, 3]``: streamvae
writes each image as a one-frame video.
"""

from __future__ import annotations

from typing import Any

from diffusers import (
    AutoencoderKLWan,
    BriaFiboEditPipeline,
    BriaFiboPipeline,
    FlowMatchEulerDiscreteScheduler,
)
from diffusers.models.transformers.transformer_bria_fibo import BriaFiboTransformer2DModel
from transformers import PreTrainedTokenizerFast
from transformers.models.smollm3.modeling_smollm3 import SmolLM3Config, SmolLM3ForCausalLM

from streamvae.testing import TINY_VAE_CONFIGS
from tests.pipelines._shared import (
    MakeKwargs,
    Pipeline,
    builder,
    call_kwargs,
    eval_mode,
    noise_image,
    seeded,
    word_tokenizer,
)

_BRIA_SIZE = 32
#: diffusers' tiny Bria Fibo transformer (tests/pipelines/bria_fibo): text width 32, two layers of it joined
_BRIA_TRANSFORMER: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 64,
    "text_encoder_dim": 32,
    "pooled_projection_dim": None,
    "axes_dims_rope": [0, 4, 4],
}
#: diffusers' tiny SmolLM3 text encoder (tests/pipelines/bria_fibo)
_SMOLLM3: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def _tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer of a few words (the rest ``[UNK]``), made in memory: no hub download. It does not split
    on whitespace: a prompt of several words is one ``[UNK]``."""
    words = ["[UNK]", "[PAD]", "a", "squirrel", "eating", "burger", "painting", "of", "bad", "ugly"]
    return word_tokenizer(words, split=False, pad_token="[PAD]")


def _bria_vae() -> AutoencoderKLWan:
    """``tiny_wan22``'s layout with 16 latent channels (Bria's), seeded, default statistics."""
    return seeded(AutoencoderKLWan, {**TINY_VAE_CONFIGS["wan22"], "z_dim": 16}).eval()


def _bria(pipeline_class: Any) -> Pipeline:
    pipe = pipeline_class(
        transformer=seeded(BriaFiboTransformer2DModel, _BRIA_TRANSFORMER),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_bria_vae(),
        text_encoder=seeded(SmolLM3ForCausalLM, {"config": SmolLM3Config(**_SMOLLM3)}),
        tokenizer=_tokenizer(),
    )
    pipe = eval_mode(pipe)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _no_embeddings() -> dict[str, Any]:
    return {}


# ``latents``: ``.images`` with output_type="latent", the packed [1, h·w, 16]
@builder(frames=(1, 1, 32, 32, 3), latents=(1, 4, 16))
def bria_fibo() -> tuple[Pipeline, MakeKwargs]:
    """Bria Fibo text to image: a JSON-like prompt through the tiny SmolLM3 (its last two hidden layers
    joined, [1, n, 64]), 32×32, guidance 5.0 → the packed latents unpacked to [1, 16, 1, 2, 2],
    de-normalized, one ``vae.decode`` → ``.images`` [1, 32, 32, 3]."""
    prompt = {
        "prompt": "{'text': 'a painting of a squirrel eating a burger'}",
        "negative_prompt": "bad, ugly",
    }
    make_kwargs = call_kwargs(
        _no_embeddings, height=_BRIA_SIZE, width=_BRIA_SIZE, guidance_scale=5.0, **prompt
    )
    return _bria(BriaFiboPipeline), make_kwargs


@builder(frames=(1, 1, 32, 32, 3), latents=(1, 4, 16))
def bria_fibo_edit() -> tuple[Pipeline, MakeKwargs]:
    """Bria Fibo Edit: :func:`bria_fibo`'s parts, a 32×32 noise image ``vae.encode``d as context tokens and
    a JSON edit instruction: one ``vae.decode`` of the generated [1, 16, 1, 2, 2] (the image's tokens are
    not decoded) → ``.images`` [1, 32, 32, 3]."""
    prompt = {
        "prompt": '{"edit_instruction": "a painting of a squirrel eating a burger"}',
        "negative_prompt": "bad, ugly",
    }

    def image(kwargs: dict[str, Any]) -> None:
        kwargs.setdefault("image", noise_image(_BRIA_SIZE))

    make_kwargs = call_kwargs(
        _no_embeddings, finish=image, height=_BRIA_SIZE, width=_BRIA_SIZE, guidance_scale=5.0, **prompt
    )
    return _bria(BriaFiboEditPipeline), make_kwargs
