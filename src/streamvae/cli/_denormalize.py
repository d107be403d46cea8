"""``decode --denormalize``: what a diffusers pipeline does to its ``output_type="latent"`` latents before
``vae.decode``, family by family (checked against the pipelines of diffusers 0.42).

A pipeline hands out latents before its last step, and ``vae.decode`` casts and scales nothing, so a latent
saved from a pipeline decodes to the pipeline's video only after that step. Where the step is a formula of
the latent and the VAE's config, it is repeated here operation for operation (the frames equal the
pipeline's own decode). Where it needs what only the pipeline's call had (LTX-Video mixes its own noise
into the latent at ``decode_timestep``), the command refuses before anything is loaded, instead of decoding
something else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamvae.cli._inputs import CliError

if TYPE_CHECKING:
    from torch import Tensor


def denormalize_latents(vae: Any, latents: Tensor) -> Tensor:
    """``latents`` (channels first) as the pipeline of ``vae``'s family passes them to ``vae.decode``.

    - Wan, Qwen-Image: :func:`streamvae.models.wan.denormalize_wan_latents` (``latents_mean`` /
      ``latents_std``).
    - HunyuanVideo and HunyuanVideo 1.5 (``HunyuanVideoPipeline``, ``HunyuanVideo15Pipeline`` and their
      image-to-video pipelines):
      ``latents.to(vae.dtype) / vae.config.scaling_factor``.
    - CogVideoX (``CogVideoXPipeline.decode_latents``): ``1 / vae.config.scaling_factor * latents``.
      CogVideoX 1.5's pipeline first drops the latent frames it padded the clip with
      (``latents[:, additional_frames:]``); a saved latent still holds them, and only its caller knows
      how many there are.

    - Allegro (``AllegroPipeline``): as CogVideoX, ``1 / scaling_factor * latents.to(vae.dtype)``.
    - Mochi (``MochiPipeline``): ``latents * latents_std / scaling_factor + latents_mean`` (the config's
      statistics in the latents' dtype), or ``latents / scaling_factor`` without them.
    - EasyAnimate (Magvit) and Stable Video Diffusion (``decode_latents``): ``1 / scaling_factor *
      latents``; SVD's pipeline latents are frames-first, [B, F, C, H, W].
    - MiniMax-H3 (the modular pipeline's decode block): ``latents * latents_std + latents_mean``, the
      config's lists as float32 tensors on the device; ``vae.decode`` casts the result.

    Each also moves the latent to the VAE's execution device, where the pipeline's already is. Raises
    :class:`CliError` for any other family (:func:`check_denormalizable`).
    """
    class_name = type(vae).__name__
    check_denormalizable(class_name)
    return _FORMULAS[class_name](vae, latents)


def check_denormalizable(class_name: str) -> None:
    """Raise :class:`CliError` unless ``--denormalize`` knows what ``class_name``'s pipeline does."""
    if class_name not in _FORMULAS:
        default = f"--denormalize does not know what the pipeline of a {class_name} does before vae.decode"
        raise CliError(_REFUSED.get(class_name, default))


def channels_first(class_name: str, latents: Tensor) -> Tensor:
    """A pipeline's latents in the layout ``vae.decode`` takes, [B, C, T, H, W]: CogVideoX's pipeline
    hands them out frames-first and permutes them before the decode (``CogVideoXPipeline.decode_latents``)."""
    return latents.permute(0, 2, 1, 3, 4) if class_name in _FRAMES_FIRST else latents


def _wan(vae: Any, latents: Tensor) -> Tensor:
    from streamvae.models.wan import denormalize_wan_latents

    return denormalize_wan_latents(vae, latents)


def _hunyuan_video(vae: Any, latents: Tensor) -> Tensor:
    scaling_factor: float = vae.config.scaling_factor
    return _on_vae(vae, latents) / scaling_factor


def _cogvideox(vae: Any, latents: Tensor) -> Tensor:
    scaling_factor: float = vae.config.scaling_factor
    return 1 / scaling_factor * _on_vae(vae, latents)


def _minimax_h3(vae: Any, latents: Tensor) -> Tensor:
    import torch

    from streamvae.models._common import execution_device

    device = execution_device(vae)
    mean = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    on_device: Tensor = latents.to(device) * std + mean
    return on_device


def _mochi(vae: Any, latents: Tensor) -> Tensor:
    import torch

    from streamvae.models._common import execution_device

    latents = latents.to(execution_device(vae))
    scaling_factor: float = vae.config.scaling_factor
    if vae.config.get("latents_mean") is None or vae.config.get("latents_std") is None:
        scaled: Tensor = latents / scaling_factor
        return scaled
    mean, std = (
        torch.tensor(vae.config[key]).view(1, 12, 1, 1, 1).to(latents.device, latents.dtype)
        for key in ("latents_mean", "latents_std")
    )
    shifted: Tensor = latents * std / scaling_factor + mean
    return shifted


def _inverse_scaling(vae: Any, latents: Tensor) -> Tensor:
    scaling_factor: float = vae.config.scaling_factor
    on_device: Tensor = 1 / scaling_factor * _on_device(vae, latents)
    return on_device


def _on_device(vae: Any, latents: Tensor) -> Tensor:
    from streamvae.models._common import execution_device

    on_device: Tensor = latents.to(execution_device(vae))
    return on_device


def _on_vae(vae: Any, latents: Tensor) -> Tensor:
    from streamvae.models._common import execution_device

    on_vae: Tensor = latents.to(execution_device(vae), dtype=vae.dtype)
    return on_vae


_FORMULAS: dict[str, Callable[[Any, Tensor], Tensor]] = {
    "AutoencoderKLWan": _wan,
    "AutoencoderKLQwenImage": _wan,
    "AutoencoderKLHunyuanVideo": _hunyuan_video,
    "AutoencoderKLHunyuanVideo15": _hunyuan_video,  # HunyuanVideo15Pipeline: the same formula
    "AutoencoderKLCogVideoX": _cogvideox,
    "AutoencoderKLMiniMaxH3": _minimax_h3,
    "AutoencoderKLMochi": _mochi,
    "AutoencoderKLAllegro": _cogvideox,  # AllegroPipeline: latents.to(vae.dtype), then 1 / scaling_factor
    "AutoencoderKLMagvit": _inverse_scaling,
    "AutoencoderKLTemporalDecoder": _inverse_scaling,
}

# Families whose pipeline latents are frames-first, [B, F, C, H, W].
_FRAMES_FIRST = ("AutoencoderKLCogVideoX", "AutoencoderKLTemporalDecoder")

# The VAEs whose pipeline latents cannot be de-normalized from the file alone, and why.
_REFUSED = dict.fromkeys(
    ("AutoencoderKLLTXVideo", "AutoencoderKLLTX2Video"),
    "--denormalize cannot rebuild an LTX-Video pipeline's decode input: its output_type='latent' latents "
    "are packed and its decode mixes in the pipeline's own noise at decode_timestep; use the pipeline API "
    "(streamvae.pipelines.generate_mp4) instead",
)
_REFUSED["AutoencoderKLCosmos"] = (
    "--denormalize cannot rebuild a Cosmos pipeline's decode input: it divides by its scheduler's "
    "sigma_data, which the VAE's config does not hold; de-normalize the latents yourself, or use "
    "streamvae.pipelines"
)
_REFUSED["AutoencoderKLKVAEVideo"] = (
    "--denormalize has nothing to undo for a KVAE: no diffusers pipeline uses it and its config holds no "
    "latent statistics; decode its latents as they are, without --denormalize"
)
