"""What the command reads: latents, a diffusers VAE, a WAV, and the output names derived from them.

Every problem with an input is a :class:`CliError` whose message names the file and what is wrong with it,
so the command can report it in one line. torch, numpy and diffusers are imported when a file is read, not
with the module: the command's ``--help`` and its option errors need none of them.
"""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor


class CliError(Exception):
    """A problem with the command's input, reported as one line without a traceback."""


def load_latents(path: Path, key: str | None = None) -> Tensor:
    """A latent [B, C, T, H, W] (or [C, T, H, W], a batch of one) from a ``.pt`` or ``.safetensors`` file.

    A file holding one tensor needs no ``key``; one holding several (a dict, or safetensors) needs it,
    unless one of them is called ``latents``.
    """
    import torch

    if not path.is_file():
        raise CliError(f"latents file {path} does not exist")
    suffix = path.suffix.lower()
    data: Any
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path))
        elif suffix in (".pt", ".pth"):
            data = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise CliError(f"latents file {path} must be .pt (torch.save) or .safetensors")
    except CliError:
        raise
    except Exception as error:
        raise CliError(f"cannot read latents from {path}: {error}") from error
    tensor = _pick_tensor(data, path, key)
    if tensor.ndim == 4:
        tensor = tensor[None]
    if tensor.ndim != 5 or tensor.numel() == 0 or not tensor.is_floating_point():
        raise CliError(
            f"the latent in {path} must be a float tensor [batch, channels, frames, height, width] "
            f"(or [channels, frames, height, width]), got {tuple(tensor.shape)} {tensor.dtype}"
        )
    return tensor


def _pick_tensor(data: object, path: Path, key: str | None) -> Tensor:
    from torch import Tensor

    if isinstance(data, Tensor):
        if key is not None:
            raise CliError(f"{path} holds a single tensor, not one named {key!r}: drop --key")
        return data
    if not isinstance(data, dict):
        raise CliError(f"{path} must hold a tensor or a dict of tensors, got {type(data).__name__}")
    tensors = {name: value for name, value in data.items() if isinstance(value, Tensor)}
    if key is not None:
        if key not in tensors:
            raise CliError(f"{path} has no tensor {key!r}; it has: {', '.join(map(str, tensors)) or 'none'}")
        return tensors[key]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    if "latents" in tensors:
        return tensors["latents"]
    raise CliError(f"{path} holds several tensors ({', '.join(map(str, tensors))}): choose one with --key")


def load_vae(
    directory: Path, *, subfolder: str | None = None, dtype: str = "float32", device: str = "cpu"
) -> Any:
    """A diffusers VAE streamvae supports, from a local ``save_pretrained`` directory."""
    class_name = vae_class_name(directory, subfolder)
    import diffusers
    import torch

    root = directory / subfolder if subfolder else directory
    try:
        vae = getattr(diffusers, class_name).from_pretrained(
            directory, subfolder=subfolder, torch_dtype=getattr(torch, dtype)
        )
    except Exception as error:
        raise CliError(f"cannot load the {class_name} in {root}: {error}") from error
    return prepare_loaded_vae(vae.to(device).eval())


def prepare_loaded_vae(vae: Any) -> Any:
    """``vae`` set up as its pipeline runs it, where loading alone does not: an ``AutoencoderKLAllegro``
    decodes only tiled (``vae.decode`` raises without it), so its tiles are on, as AllegroPipeline's
    examples turn them on (``vae.enable_tiling()``, diffusers' default tile sizes)."""
    if type(vae).__name__ == "AutoencoderKLAllegro" and not vae.use_tiling:
        vae.enable_tiling()
    return vae


def vae_class_name(directory: Path, subfolder: str | None = None) -> str:
    """The diffusers class of the VAE saved in ``directory`` (read from its config, nothing loaded), if
    streamvae decodes it."""
    from streamvae.models import supported_classes

    if not directory.is_dir():
        raise CliError(f"VAE directory {directory} does not exist")
    root = directory / subfolder if subfolder else directory
    config_path = root / "config.json"
    if not config_path.is_file():
        hint = ""
        if subfolder is None and (directory / "vae" / "config.json").is_file():
            hint = " (it looks like a pipeline: add --subfolder vae)"
        raise CliError(f"{root} is not a diffusers VAE directory: it has no config.json{hint}")
    try:
        class_name = json.loads(config_path.read_text())["_class_name"]
    except (ValueError, KeyError, TypeError) as error:
        raise CliError(f"{config_path} is not a diffusers model config (no _class_name): {error}") from error
    if class_name not in supported_classes():
        raise CliError(
            f"{root} holds a {class_name}, not a VAE streamvae decodes "
            f"(supported: {', '.join(supported_classes())})"
        )
    return str(class_name)


def read_wav(path: Path) -> tuple[np.ndarray[Any, np.dtype[np.float32]], int]:
    """A 16-bit PCM WAV file as float32 ``[channels, samples]`` in [-1, 1], and its sample rate."""
    import numpy as np

    if not path.is_file():
        raise CliError(f"audio file {path} does not exist")
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            raw = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as error:
        raise CliError(f"{path} is not a PCM WAV file: {error}") from error
    if width != 2:
        raise CliError(f"{path} has {8 * width}-bit samples; only 16-bit PCM WAV is read")
    if channels not in (1, 2):
        raise CliError(f"{path} has {channels} channels; mono or stereo only")
    samples = np.frombuffer(raw, dtype="<i2").reshape(-1, channels).T
    return (samples.astype(np.float32) / 32768.0).copy(), rate


def expected_frames(vae: Any, latent_frames: int) -> int | None:
    """Frames ``vae`` decodes from ``latent_frames``: what its adapter says (MiniMax-H3's clips, SVD's
    frame per latent), else 1 + scale·(T − 1) for a causal video VAE whose config gives the scale."""
    from streamvae.models import as_decoder

    known = as_decoder(vae).output_frames(latent_frames)
    if known is not None:
        return known
    config = getattr(vae, "config", None)
    for name in ("scale_factor_temporal", "temporal_compression_ratio"):
        scale = None if config is None else getattr(config, name, None)
        if isinstance(scale, int):
            return 1 + scale * (latent_frames - 1)
    return None


def output_paths(output: Path, batch: int) -> list[Path]:
    """``OUT.mp4`` for one entry, ``OUT-0.mp4``, ``OUT-1.mp4``, … for more."""
    if batch == 1:
        return [output]
    return [output.with_name(f"{output.stem}-{entry}{output.suffix}") for entry in range(batch)]
