"""Cosmos 1 (AutoencoderKLCosmos), Cosmos 2, 2.5 and 3 (AutoencoderKLWan), and Cosmos 3's modular blocks.

Every Cosmos pipeline takes a ``safety_checker``, and none runs without one: ``None`` makes ``__init__``
build cosmos_guardrail's ``CosmosSafetyChecker`` (an ImportError without that package), and Cosmos 1 and 2
raise in ``__call__`` if it was removed. The builders pass :class:`FramesAsTheyAre`, the stand-in diffusers'
own tests use: it finds every prompt safe and gives every video back unchanged. What the pipelines do with
a checker after ``vae.decode`` differs:

- Cosmos 1 and 2 (and 2.5 Transfer, and the Cosmos 3 blocks) pass the decoded video through any safety
  checker: they post-process it to uint8 (``(x / 2 + 0.5).clamp(0, 1) · 255``, truncated), hand each video
  to ``check_video_safety`` and map the result back. With the stand-in that is only the uint8 truncation,
  within a level of the MP4's rounding.
- Cosmos 2.5 Predict and the Cosmos 3 pipeline run ``check_video_safety`` only when the checker is a real
  ``CosmosSafetyChecker``; with the stand-in their frames are the decode's own.

The real guardrail pixelates the faces it finds and can reject the video, after the whole video is
decoded; streamvae never holds the whole video, so a call that would run it is refused before any step
(``_plans._cosmos_guardrail``; tests/test_generate_every.py checks it), and a checker of another class is
never given the video.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import torch
from diffusers import (
    Cosmos2_5_PredictBasePipeline,
    Cosmos2_5_TransferPipeline,
    Cosmos2TextToImagePipeline,
    Cosmos2VideoToWorldPipeline,
    Cosmos3DistilledBlocks,
    Cosmos3DistilledModularPipeline,
    Cosmos3OmniBlocks,
    Cosmos3OmniModularPipeline,
    Cosmos3OmniPipeline,
    Cosmos3OmniTransformer,
    CosmosControlNetModel,
    CosmosTextToWorldPipeline,
    CosmosTransformer3DModel,
    CosmosVideoToWorldPipeline,
    EDMEulerScheduler,
    FlowMatchEulerDiscreteScheduler,
    UniPCMultistepScheduler,
)
from transformers import PreTrainedTokenizerFast

from tests._vaes import tiny_cosmos, tiny_wan21
from tests.pipelines._shared import (
    MakeKwargs,
    Pipeline,
    builder,
    call_kwargs,
    noise_frames,
    pipeline,
    prompt_pair,
    seeded,
    video_kwargs,
    word_tokenizer,
)
from tests.pipelines.modular import _modular
from tests.pipelines.wan import flow_unipc


class FramesAsTheyAre:
    """A stand-in for cosmos_guardrail's ``CosmosSafetyChecker`` (as diffusers' tests have one): every
    prompt is safe and every video comes back unchanged. The real checker is several large models (a
    LlamaGuard text check, a video content filter, RetinaFace face blurring), not something to build tiny."""

    def to(self, *args: Any, **kwargs: Any) -> FramesAsTheyAre:
        return self

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, frames: np.ndarray) -> np.ndarray:
        return frames


_COSMOS_TEXT_DIM = 32
#: The blocks of diffusers' tiny Cosmos transformer (tests/pipelines/cosmos), which its Cosmos 2.5 Transfer
#: ControlNet shares: the ControlNet's block outputs are added to the transformer's hidden states, so its
#: blocks (width 2 × 16 = 32), patches, RoPE and text width are the transformer's.
_COSMOS_BLOCKS: dict[str, Any] = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "mlp_ratio": 2,
    "text_embed_dim": _COSMOS_TEXT_DIM,
    "adaln_lora_dim": 4,
    "max_size": (4, 32, 32),
    "patch_size": (1, 2, 2),
    "rope_scale": (2.0, 1.0, 1.0),
    "extra_pos_embed_type": "learnable",
}
#: diffusers' tiny Cosmos 1 transformer (tests/pipelines/cosmos), its latents tiny_cosmos's 4 channels, less
#: ``concat_padding_mask``: that resizes the (all-zero) padding mask with torchvision, which PyPI has only as
#: a CUDA build that does not import beside a CPU torch; without it the transformer reads no padding mask.
_COSMOS1_TRANSFORMER: dict[str, Any] = {
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 2,
    "concat_padding_mask": False,
    **_COSMOS_BLOCKS,
}


def _edm_euler() -> EDMEulerScheduler:
    """diffusers' Cosmos 1 test scheduler (Karras sigmas, epsilon prediction)."""
    return EDMEulerScheduler(
        sigma_min=0.002,
        sigma_max=80,
        sigma_data=0.5,
        sigma_schedule="karras",
        num_train_timesteps=1000,
        prediction_type="epsilon",
        rho=7.0,
        final_sigmas_type="sigma_min",
    )


def _cosmos1(pipeline_class: Any, seed: int = 0) -> Pipeline:
    transformer = {**_COSMOS1_TRANSFORMER}
    if pipeline_class is CosmosVideoToWorldPipeline:
        transformer["in_channels"] = 4 + 1  # the condition mask
    return pipeline(
        pipeline_class,
        transformer=seeded(CosmosTransformer3DModel, transformer, seed=seed),
        vae=tiny_cosmos(),
        scheduler=_edm_euler(),
        safety_checker=FramesAsTheyAre(),
    )


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 4, 2, 4, 4))
def cosmos_t2w() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 1 text to world (``tiny_cosmos``: 4 channels, 8× in time and space, no latent statistics;
    diffusers' tiny transformer; :class:`FramesAsTheyAre`): 32×32, 9 frames, guidance 3.0 → one
    ``vae.decode(latents / sigma_data, return_dict=False)`` of [1, 4, 2, 4, 4] → 1 + 8 frames, then the
    safety checker's uint8 round trip."""
    return _cosmos1(CosmosTextToWorldPipeline), video_kwargs(32, 3.0, prompt_pair(_COSMOS_TEXT_DIM))


def _cosmos1_video(kwargs: dict[str, Any]) -> None:
    kwargs.setdefault("video", noise_frames(5, 32, seed=3))


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 4, 2, 4, 4))
def cosmos_v2w() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 1 video to world (:func:`cosmos_t2w`'s parts, the transformer taking the condition mask as a
    fifth channel): a 5-frame 32×32 noise video, zero-padded to 9 frames, ``vae.encode``d (its latents
    sampled from the call's generator); the first ``(5 − 1) // 8 + 1`` = 1 latent frame conditions the
    denoising of [1, 4, 2, 4, 4], then one ``vae.decode`` → 9 frames and the safety checker's uint8 round
    trip."""
    return _cosmos1(CosmosVideoToWorldPipeline), video_kwargs(
        32, 3.0, prompt_pair(_COSMOS_TEXT_DIM), finish=_cosmos1_video
    )


def _cosmos2(pipeline_class: Any, in_channels: int) -> Pipeline:
    """A Cosmos 2 pipeline: :func:`_cosmos1`'s transformer on ``tiny_wan21``'s 16 channels (plus the
    condition mask for video to world), Karras flow-matching sigmas, :class:`FramesAsTheyAre`."""
    transformer = {**_COSMOS1_TRANSFORMER, "in_channels": in_channels, "out_channels": 16}
    return pipeline(
        pipeline_class,
        transformer=seeded(CosmosTransformer3DModel, transformer),
        vae=tiny_wan21(),
        scheduler=FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True),
        safety_checker=FramesAsTheyAre(),
    )


# an image pipeline: ``.images`` [1, 32, 32, 3], here a one-frame video; ``latents``: ``.images`` with
# output_type="latent", the latent frame [1, 16, 4, 4]
@builder(frames=(1, 1, 32, 32, 3), latents=(1, 16, 4, 4))
def cosmos2_t2i() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 2 text to image (``tiny_wan21``): 32×32, guidance 3.0 → one ``vae.decode`` of the
    de-normalized (``latents_std``, ``latents_mean``, ``sigma_data`` 1) [1, 16, 1, 4, 4] → 1 frame, the
    safety checker's uint8 round trip, then the frame as ``.images`` [1, 32, 32, 3]: streamvae writes it as
    a one-frame video."""
    pipe = _cosmos2(Cosmos2TextToImagePipeline, 16)
    return pipe, call_kwargs(prompt_pair(_COSMOS_TEXT_DIM), height=32, width=32, guidance_scale=3.0)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 16, 3, 4, 4))
def cosmos2_v2w() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 2 video to world from an image (``tiny_wan21``; the transformer takes the condition mask): a
    32×32 noise image, ``vae.encode``d as the first of 9 frames (the rest its last frame repeated), its
    latent frame the condition of [1, 16, 3, 4, 4]; one ``vae.decode`` → 9 frames, then the safety
    checker's uint8 round trip."""
    pipe = _cosmos2(Cosmos2VideoToWorldPipeline, 16 + 1)
    return pipe, video_kwargs(32, 3.0, prompt_pair(_COSMOS_TEXT_DIM), image=True)


@builder(frames=(1, 9, 32, 32, 3), latents=(1, 16, 3, 4, 4))
def cosmos2_5_predict() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 2.5 Predict, text to world (no ``image``, no ``video``; diffusers' tiny transformer with the
    condition mask channel, ``tiny_wan21``, flow-matching UniPC): 32×32, 9 frames, guidance 3.0 → one
    ``vae.decode(latents / latents_std + latents_mean)`` of [1, 16, 3, 4, 4] → 9 frames. Its
    ``_match_num_frames`` leaves them as they are (9 is ``4k + 1``: the decode gives ``num_frames``), and
    the stand-in checker is no ``CosmosSafetyChecker``, so no uint8 round trip: the frames are the
    decode's."""
    transformer = {**_COSMOS1_TRANSFORMER, "in_channels": 16 + 1, "out_channels": 16}
    pipe = pipeline(
        Cosmos2_5_PredictBasePipeline,
        transformer=seeded(CosmosTransformer3DModel, transformer),
        vae=tiny_wan21(),
        scheduler=flow_unipc(5.0),
        safety_checker=FramesAsTheyAre(),
    )
    return pipe, video_kwargs(32, 3.0, prompt_pair(_COSMOS_TEXT_DIM))


# -- Cosmos 2.5 Transfer: a ControlNet over a control video, generated chunk by chunk --

#: diffusers' tiny Cosmos 2.5 Transfer ControlNet (tests/pipelines/cosmos): its control and base inputs are
#: tiny_wan21's 16 channels, the condition mask and the padding mask
_COSMOS2_5_CONTROLNET: dict[str, Any] = {
    "n_controlnet_blocks": 2,
    "in_channels": 16 + 1 + 1,
    "latent_channels": 16 + 1 + 1,
    "model_channels": _COSMOS_BLOCKS["num_attention_heads"] * _COSMOS_BLOCKS["attention_head_dim"],
    "use_crossattn_projection": False,
    **_COSMOS_BLOCKS,
}


def _nearest_resize(image: torch.Tensor, size: list[int], interpolation: str, **_: Any) -> torch.Tensor:
    """torchvision's ``transforms.functional.resize`` of a tensor with ``InterpolationMode.NEAREST``, as
    torchvision computes it (``_functional_tensor.resize``: ``interpolate(mode="nearest")`` in float32,
    cast back): the same values."""
    return torch.nn.functional.interpolate(image.float(), size=size, mode=interpolation).to(image.dtype)


def _controlnet_without_torchvision() -> None:
    """``CosmosControlNetModel.forward`` always resizes its (all-zero) padding mask to the latents' size with
    torchvision's ``transforms.functional.resize``, the only thing it takes from torchvision, imported only
    where torchvision is; PyPI has torchvision only as a CUDA build that does not import beside a CPU torch.
    Where the module has no ``transforms``, give it :func:`_nearest_resize` under that name (torchvision's
    own arithmetic, so the pipeline computes what it computes with torchvision)."""
    from diffusers.models.controlnets import controlnet_cosmos

    if not hasattr(controlnet_cosmos, "transforms"):
        functional = types.SimpleNamespace(resize=_nearest_resize)
        modes = types.SimpleNamespace(NEAREST="nearest")
        controlnet_cosmos.transforms = types.SimpleNamespace(functional=functional, InterpolationMode=modes)


def _cosmos2_5_controls(kwargs: dict[str, Any]) -> None:
    kwargs.setdefault("controls", noise_frames(kwargs.pop("num_frames"), 32, seed=3))


@builder(frames=(1, 13, 32, 32, 3), latents=(1, 16, 4, 4, 4))
def cosmos2_5_transfer() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 2.5 Transfer (diffusers' tiny transformer and ControlNet, ``tiny_wan21``, flow-matching UniPC):
    a 13-frame 32×32 noise control video, guidance 3.0, in chunks of 9 frames that overlap by one
    (``num_ar_conditional_frames``, 1 by default): frames 0–8, then 8–12 (the control padded to 9 with its
    last frame), each ``vae.encode``d as the ControlNet's input and denoised as [1, 16, 3, 4, 4], the
    second conditioned on the first's decoded last frame; a ``vae.decode`` each. The video is the first
    chunk's 9 frames and the second's after its first, cut to the control's 13, then the safety checker's
    uint8 round trip. ``latents``: the chunks' latents, the second's first latent frame dropped, cut to
    ``(13 − 1) // 4 + 1`` = 4."""
    _controlnet_without_torchvision()
    transformer = {**_COSMOS1_TRANSFORMER, "in_channels": 16 + 1, "out_channels": 16}
    pipe = pipeline(
        Cosmos2_5_TransferPipeline,
        transformer=seeded(CosmosTransformer3DModel, {**transformer, "controlnet_block_every_n": 1}),
        controlnet=seeded(CosmosControlNetModel, _COSMOS2_5_CONTROLNET),
        vae=tiny_wan21(),
        scheduler=flow_unipc(5.0),
        safety_checker=FramesAsTheyAre(),
    )
    return pipe, video_kwargs(
        32,
        3.0,
        prompt_pair(_COSMOS_TEXT_DIM),
        finish=_cosmos2_5_controls,
        num_frames=13,
        num_frames_per_chunk=9,
    )


# -- Cosmos 3: one transformer over the prompt's token ids and the vision latents --

#: diffusers' tiny Cosmos 3 transformer (tests/pipelines/cosmos), its vocabulary Qwen's size
_COSMOS3_TRANSFORMER: dict[str, Any] = {
    "head_dim": 6,
    "hidden_act": "relu2",
    "hidden_size": 6,
    "intermediate_size": 12,
    "latent_channel": 16,
    "latent_patch_size": 1,
    "num_attention_heads": 1,
    "num_hidden_layers": 1,
    "num_key_value_heads": 1,
    "patch_latent_dim": 16,
    "qk_norm_for_text": False,
    "rms_norm_eps": 1e-5,
    "rope_axes_dim": [1, 1, 1],
    "vocab_size": 151657,
}
_COSMOS3_SIZE = 16


def _cosmos3_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer of a few words made in memory (no hub download), with what the pipelines read of
    Qwen's: ``<|vision_start|>`` (the start of generation), an end-of-text token and a chat template."""
    words = ["[UNK]", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|endoftext|>", "a", "dog", "bad"]
    tokenizer = word_tokenizer(
        words,
        eos_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", "<|vision_start|>"],
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
    )
    return tokenizer


def _no_embeddings() -> dict[str, Any]:
    return {}


def _cosmos3_kwargs(**options: Any) -> MakeKwargs:
    """A 16×16, 9-frame call with a prompt (Cosmos 3 tokenizes it itself: there are no embeddings)."""
    size = {"height": _COSMOS3_SIZE, "width": _COSMOS3_SIZE, "num_frames": 9}
    return call_kwargs(_no_embeddings, prompt="a dog", **size, **options)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def cosmos3() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 3 omni, text to video (diffusers' tiny transformer, ``tiny_wan21``, UniPC, the in-memory
    tokenizer, :class:`FramesAsTheyAre`; no sound tokenizer): "a dog", 16×16, 9 frames, guidance 3.0 →
    one ``vae.decode(latents / latents_inv_std + latents_mean)`` of [1, 16, 3, 2, 2], then ``.video``
    [9, 16, 16, 3]: the pipeline makes one video a call and drops the batch axis. The stand-in checker is
    no ``CosmosSafetyChecker``: no uint8 round trip."""
    pipe = pipeline(
        Cosmos3OmniPipeline,
        transformer=seeded(Cosmos3OmniTransformer, _COSMOS3_TRANSFORMER),
        text_tokenizer=_cosmos3_tokenizer(),
        vae=tiny_wan21(),
        scheduler=UniPCMultistepScheduler(),
        sound_tokenizer=None,
        safety_checker=FramesAsTheyAre(),
    )
    return pipe, _cosmos3_kwargs(negative_prompt="bad", guidance_scale=3.0)


@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def cosmos3_i2v() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 3 omni, image to video (:func:`cosmos3`'s pipe): a 16×16 noise image, ``vae.encode``d (its
    latent's mode) as the first latent frame, kept through the loop; the same decode as :func:`cosmos3`."""
    pipe, _ = cosmos3()
    return pipe, _cosmos3_kwargs(negative_prompt="bad", guidance_scale=3.0, image=_COSMOS3_SIZE)


def _cosmos3_modular(pipeline_class: Any, blocks: Any, scheduler: Any) -> Pipeline:
    """``blocks`` whole (their text step is the tokenizer: the transformer takes token ids) with
    :func:`cosmos3`'s parts, and :class:`FramesAsTheyAre` as the safety checker they require."""
    pipe = _modular(
        pipeline_class,
        blocks,
        drop=(),
        transformer=seeded(Cosmos3OmniTransformer, _COSMOS3_TRANSFORMER),
        vae=tiny_wan21(),
        text_tokenizer=_cosmos3_tokenizer(),
        scheduler=scheduler,
    )
    pipe.enable_safety_checker(FramesAsTheyAre())
    return pipe


# ``frames``: output "videos" with output_type="np" as [1, …] (the blocks drop the batch axis: [9, 16, 16, 3])
@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def cosmos3_modular() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 3 omni, ``Cosmos3OmniBlocks`` (its ``text2video`` workflow) in a
    ``Cosmos3OmniModularPipeline`` with :func:`cosmos3`'s parts: "a dog", 16×16, 9 frames, guidance 3.0 →
    one ``vae.decode`` of [1, 16, 3, 2, 2] → ``videos`` [9, 16, 16, 3], then the safety checker's uint8
    round trip (the blocks pass any checker the video; this one gives it back)."""
    pipe = _cosmos3_modular(Cosmos3OmniModularPipeline, Cosmos3OmniBlocks(), UniPCMultistepScheduler())
    return pipe, _cosmos3_kwargs(negative_prompt="bad", guidance_scale=3.0)


# ``frames``: output "videos" as [1, …], as for cosmos3_modular
@builder(frames=(1, 9, 16, 16, 3), latents=(1, 16, 3, 2, 2))
def cosmos3_distilled_modular() -> tuple[Pipeline, MakeKwargs]:
    """Cosmos 3 distilled, ``Cosmos3DistilledBlocks`` in a ``Cosmos3DistilledModularPipeline``
    (:func:`cosmos3`'s parts, a flow-matching Euler scheduler; the schedule is its config's
    ``distilled_sigmas``, here [1.0, 0.6]: 2 steps, guidance baked in, so the call gives neither steps, nor
    guidance, nor a negative prompt): "a dog", 16×16, 9 frames → one ``vae.decode`` of [1, 16, 3, 2, 2] →
    ``videos`` [9, 16, 16, 3], then the safety checker's uint8 round trip."""
    pipe = _cosmos3_modular(
        Cosmos3DistilledModularPipeline, Cosmos3DistilledBlocks(), FlowMatchEulerDiscreteScheduler()
    )
    pipe.update_components(distilled_sigmas=[1.0, 0.6])
    make_kwargs = _cosmos3_kwargs()

    def without_steps(**overrides: Any) -> dict[str, Any]:
        kwargs = make_kwargs(**overrides)
        if "num_inference_steps" not in overrides:
            del kwargs["num_inference_steps"]  # fixed by distilled_sigmas
        return kwargs

    return pipe, without_steps
