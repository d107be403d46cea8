"""The checks at the door: one check per kind of input, shared by every entry point.

Every public function checks each argument when it is called, before any work, with the check for its
kind here, so the same mistake reads the same wherever it is made. The rule is one and the same
everywhere:

- a bad **value** — whatever its type: ``fps="16"``, ``crop=("a", 1)``, ``batch_frames=1.5`` — is a
  :class:`ValueError`;
- the wrong **kind of object** where an object is expected — a VAE, a tensor, a limiter, ``options=`` —
  is a :class:`TypeError`.

Each error names the argument and the form it expects, and, given ``owner``, the function the user called
(``"decode_to_mp4: fps must be …"``). Latent and chunk checks read shapes and dtypes only, never tensor
data, so they may run on an event loop. torch and numpy are imported by the checks that take their
objects, so a command line's option checks answer without loading them.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import anyio

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

__all__ = [
    "MAX_FPS",
    "MAX_SEED",
    "MIN_FPS",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_chunk",
    "check_fps",
    "check_int",
    "check_latents",
    "check_limiter",
    "check_seconds",
    "check_waveform",
    "did_you_mean",
    "is_int",
    "prefixed",
]

#: The frame rates a session accepts. Outside them the MP4 time base is not representable (1e-4 fps rounds
#: to 0 with denominators up to 1001) or FFmpeg's muxer writes a file its own demuxer reads wrongly.
MIN_FPS, MAX_FPS = Fraction(1, 1000), Fraction(1000)
#: The largest seed ``torch.Generator.manual_seed`` takes: the server's ``seed`` and the CLI's ``--seed``.
MAX_SEED = 2**64 - 1


def prefixed(owner: str | None, message: str) -> str:
    """``message`` prefixed with the function the user called, when known."""
    return message if owner is None else f"{owner}: {message}"


def check_int(
    name: str, value: object, *, minimum: int, maximum: int | None = None, owner: str | None = None
) -> int:
    """``value`` if it is an int (not a bool) from ``minimum`` to ``maximum``, else a ValueError naming
    ``name``."""
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        shown = f"{type(value).__name__} {value!r}" if not isinstance(value, int) else repr(value)
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ValueError(prefixed(owner, f"{name} must be an int {bounds}, got {shown}"))
    return value


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool (``True`` is an int to Python, not to a user or JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_bool(name: str, value: object, *, owner: str | None = None) -> bool:
    """``value`` if it is True or False (not a truthy object), else a ValueError naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(prefixed(owner, f"{name} must be True or False, got {value!r}"))
    return value


def check_path(name: str, value: object, *, owner: str | None = None) -> Path | None:
    """``value`` as a :class:`~pathlib.Path` (None stays None); a TypeError naming ``name`` unless it is a
    str or a path."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(prefixed(owner, f"{name} must be a str, a path or None, got {type(value).__name__}"))
    return Path(value)


def check_callable(name: str, value: object, *, owner: str | None = None) -> None:
    """A TypeError naming ``name`` unless ``value`` is None or a callable (a hook the library calls)."""
    if value is not None and not callable(value):
        raise TypeError(prefixed(owner, f"{name} must be a callable or None, got {type(value).__name__}"))


def check_choice(name: str, value: object, choices: Sequence[str], *, owner: str | None = None) -> None:
    """A ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(map(repr, choices[:-1])) + f" or {choices[-1]!r}"
        raise ValueError(prefixed(owner, f"{name} must be {listed}, got {value!r}"))


def check_fps(fps: object, *, owner: str | None = None) -> Fraction:
    """``fps`` as an exact rational (23.976 → 2997/125, 30000/1001 stays), or a ValueError unless it is a
    number between 1/1000 and 1000."""
    if isinstance(fps, bool) or not isinstance(fps, (int, float, Fraction)):
        raise ValueError(prefixed(owner, f"fps must be a number of frames per second, got {fps!r}"))
    if fps != fps or not MIN_FPS <= fps <= MAX_FPS:
        raise ValueError(
            prefixed(owner, f"fps must be a number between 1/1000 and 1000 frames per second, got {fps!r}")
        )
    return Fraction(fps).limit_denominator(1001)


def check_seconds(
    name: str, value: object, *, owner: str | None = None, zero: bool = False, infinite: bool = False
) -> float:
    """``value`` as a number of seconds (not a bool), else a ValueError naming ``name``: positive and
    finite by default; ``zero`` admits 0, ``infinite`` admits ``math.inf`` (for "never")."""
    if not zero:
        form = "a positive, finite number of seconds"
    elif infinite:
        form = "a number of seconds >= 0 (math.inf: never)"
    else:
        form = "a finite number of seconds >= 0"
    refused = ValueError(prefixed(owner, f"{name} must be {form}, got {value!r}"))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refused
    if not (value >= 0 if zero else value > 0) or (value == math.inf and not infinite):  # NaN fails too
        raise refused
    return float(value)


def did_you_mean(name: object, known: Sequence[str] | frozenset[str], *, most: int = 1) -> str:
    """``"; did you mean 'x'?"`` naming the ``most`` entries of ``known`` nearest to ``name``, or ``""``."""
    nearest = difflib.get_close_matches(str(name), known, n=most)
    return f"; did you mean {' or '.join(map(repr, nearest))}?" if nearest else ""


def check_limiter(name: str, value: object, *, owner: str | None = None) -> anyio.CapacityLimiter | None:
    """``value`` if it is None or an :class:`anyio.CapacityLimiter`, else a TypeError naming ``name``.

    A limiter is an object the library calls into: anything else would fail later, from a worker thread,
    with an AttributeError that names neither the argument nor the call that gave it.
    """
    if value is not None and not isinstance(value, anyio.CapacityLimiter):
        raise TypeError(
            prefixed(owner, f"{name} must be an anyio.CapacityLimiter or None, got {type(value).__name__}")
        )
    return value


# A pipeline's ``output_type="latent"`` is not always what ``vae.decode`` takes: say what to do instead.
_PACKED_HINT = (
    "; a [batch, tokens, channels] latent is a pipeline's packed output (LTX-Video's output_type='latent'): "
    "let streamvae.pipelines.generate_mp4(pipe, ...) run the pipeline and decode what it passes to vae.decode"
)
_FRAMES_FIRST_HINT = (
    "; these latents are frames-first [batch, frames, channels, height, width] (CogVideoX's "
    "output_type='latent'): let streamvae.pipelines.generate_mp4(pipe, ...) run the pipeline, or permute "
    "and scale them as the pipeline does before vae.decode"
)


def check_latents(z: object, channels: int | None, *, owner: str, name: str = "z") -> Tensor:
    """``z`` if it is a latent a decoder takes: a non-empty floating-point ``[B, channels, T, H, W]``
    tensor (any channel count when ``channels`` is None); else a TypeError (not a tensor) or ValueError.

    Whole latents and the pieces of a latent stream are checked alike: a piece is a latent too. Integer,
    bool and complex latents are refused, as ``vae.decode`` refuses them, instead of being cast.
    """
    from torch import Tensor  # here, not at the top: a CLI's option check needs no torch

    expected = f"[batch, {'channels' if channels is None else channels}, frames, height, width]"
    if not isinstance(z, Tensor):
        raise TypeError(f"{owner}: {name} must be a torch.Tensor {expected}, got {type(z).__name__}")
    if z.ndim != 5:
        hint = _PACKED_HINT if z.ndim == 3 else ""
        raise ValueError(f"{owner}: {name} must be a 5-D latent {expected}, got shape {tuple(z.shape)}{hint}")
    if not z.is_floating_point():
        raise ValueError(
            f"{owner}: {name} must be a floating-point latent (float32, float16 or bfloat16), got {z.dtype}"
        )
    if channels is not None and z.shape[1] != channels:
        hint = _FRAMES_FIRST_HINT if z.shape[2] == channels else ""
        raise ValueError(
            f"{owner}: {name} must have {channels} latent channels in dim 1 {expected}, "
            f"got shape {tuple(z.shape)}{hint}"
        )
    if z.numel() == 0:
        raise ValueError(f"{owner}: {name} must not be empty {expected}, got shape {tuple(z.shape)}")
    return z


def check_chunk(chunk: object, *, owner: str = "push") -> Tensor:
    """``chunk`` if it is a video chunk a session takes: a floating-point BCTHW tensor with 3 (RGB)
    channels and at least one frame of at least 1×1 pixels; else a TypeError or ValueError."""
    from torch import Tensor

    expected = "[batch, 3, frames, height, width]"
    if not isinstance(chunk, Tensor):
        raise TypeError(f"{owner}: chunk must be a torch.Tensor {expected}, got {type(chunk).__name__}")
    if chunk.ndim != 5:
        raise ValueError(f"{owner}: chunk must be 5-D {expected}, got shape {tuple(chunk.shape)}")
    if not chunk.is_floating_point():
        raise ValueError(f"{owner}: chunk must be floating point (fp32, fp16 or bf16), got {chunk.dtype}")
    if chunk.shape[1] != 3:
        raise ValueError(
            f"{owner}: chunk must have 3 (RGB) channels in dim 1 {expected}, got shape {tuple(chunk.shape)}"
        )
    if chunk.numel() == 0:
        raise ValueError(
            f"{owner}: chunk must hold at least one frame of one entry, at least 1×1 pixels {expected}, "
            f"got shape {tuple(chunk.shape)}"
        )
    return chunk


def check_waveform(waveform: object, *, name: str) -> np.ndarray[Any, np.dtype[np.float32]]:
    """A waveform as float32 ``[channels, samples]`` (1 or 2 channels), or a ValueError naming ``name``."""
    import numpy as np
    from torch import Tensor

    # Integer, bool and complex tensors are refused like such arrays, not cast: a cast would hide them.
    if isinstance(waveform, Tensor) and waveform.is_floating_point():
        waveform = waveform.detach().cpu().float().numpy()
    if not isinstance(waveform, np.ndarray) or not np.issubdtype(waveform.dtype, np.floating):
        shown = getattr(waveform, "dtype", type(waveform).__name__)
        raise ValueError(
            f"{name} must be a float array or tensor [samples] or [channels, samples], got {shown}"
        )
    if waveform.ndim == 1:
        waveform = waveform[None]
    if waveform.ndim != 2 or waveform.shape[0] not in (1, 2):
        raise ValueError(
            f"{name} must be 1-D [samples] or 2-D [channels, samples] with 1 or 2 channels, "
            f"got shape {tuple(waveform.shape)}"
        )
    waveform = np.ascontiguousarray(waveform, dtype=np.float32)
    bad = int(waveform.size - np.count_nonzero(np.isfinite(waveform)))
    if bad:
        raise ValueError(f"{name} must be finite, but {bad} of its {waveform.size} samples are NaN or ±inf")
    return waveform
