"""The stand-in model: :class:`demo_generator`, a seeded latent one latent frame a step, steered by prompts.

What ``streamvae serve`` and :func:`streamvae.server.create_app` generate without a model of their own:
a :data:`streamvae.server.RealtimeGenerator` that reads its start message's fields (each checked, a bad
one a ValueError the client is told), reseeds on an interaction's ``prompt`` or ``seed``, blends to the
new latent over ``transition_chunks`` pieces, and with ``audio`` makes a tone whose pitch follows the seed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import AsyncIterator, Mapping
from fractions import Fraction
from typing import Any

import anyio
import torch
from torch import Tensor

from streamvae._checks import MAX_SEED, check_fps, check_int, check_limiter, is_int
from streamvae.demo import DEMO_FPS, check_demo_request, demo_latent
from streamvae.server._realtime import Interaction, Interactions, RealtimePiece
from streamvae.server._values import shown

__all__ = ["DEMO_SAMPLE_RATE", "MAX_DELAY", "demo_generator", "seed_of_prompt", "tone_hz"]

#: seconds a stand-in step may take at most: a longer one is a slow client's way to hold a slot
MAX_DELAY = 2.0
#: the stand-in's soundtrack
DEMO_SAMPLE_RATE = 48_000


def seed_of_prompt(prompt: str) -> int:
    """The stand-in's seed for a prompt: the first 8 bytes of its UTF-8 SHA-256 (stable across runs); a
    ValueError for a prompt UTF-8 cannot encode (a lone surrogate, which JSON's ``"\\ud800"`` makes)."""
    try:
        encoded = prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"event.prompt must be Unicode text (no lone surrogate), got {shown(prompt)}"
        ) from None
    return int.from_bytes(hashlib.sha256(encoded).digest()[:8], "big")


def tone_hz(seed: int) -> float:
    """The pitch of the stand-in's tone for ``seed``: one of 24 semitones from 220 Hz."""
    return float(220.0 * 2.0 ** ((seed % 24) / 12))


class demo_generator:  # a function to its callers (it was one): a class for check_interaction
    """The stand-in model: :func:`streamvae.demo.demo_latent` of the request, one latent frame a step,
    steered by the client's interactions.

    It reads from the start message:

    - ``num_frames``: 1 + 4k, at most ``max_frames``; default 33.
    - ``width`` and ``height``: multiples of 16, at most ``max_size``; default 128.
    - ``seed``: 0 … 2**64 − 1; default 0.
    - ``step_seconds``: 0 … 2 (a number); default 0. The wait between the pieces it generates, so that an
      interaction meets pieces still to come.
    - ``audio``: a boolean; default false. With true it makes a soundtrack: a tone whose pitch follows the
      seed, at 48 kHz mono, as long as the video.

    Any other value is a ValueError naming it (an ``error`` to the client). The latents are built in a
    worker thread under ``limiter`` (default anyio's own), and decode to ``num_frames`` frames of ``width``
    × ``height`` with :func:`streamvae.demo.demo_vae`.

    An interaction whose event has a ``prompt`` (a string; or a ``seed``, an integer) reseeds the latent
    from the next piece, to ``seed_of_prompt(prompt)`` (a ``null`` prompt is no prompt: the seed then
    applies). With ``transition_chunks`` n it blends from the old latent to the new over n + 1 pieces: the
    event is started at the first and completed at the last. The pieces before are those of the same
    session without the interaction. An event it cannot apply (neither, or a value of the wrong kind) is
    refused by :meth:`check_interaction` (the client's ``interaction_failed``), and passed over if it
    reaches the stand-in unchecked: no client's message ends the session.
    """

    def __init__(
        self,
        *,
        max_frames: int = 257,
        max_size: int = 512,
        limiter: anyio.CapacityLimiter | None = None,
        fps: float | Fraction = DEMO_FPS,
    ) -> None:
        check_int("max_frames", max_frames, minimum=1, owner="demo_generator")
        check_int("max_size", max_size, minimum=16, owner="demo_generator")
        self.max_frames = max_frames
        self.max_size = max_size
        self.limiter = check_limiter("limiter", limiter, owner="demo_generator")
        self.fps = check_fps(fps, owner="demo_generator")

    def __call__(
        self, start: dict[str, Any], interactions: Interactions | None = None
    ) -> AsyncIterator[RealtimePiece]:
        frames = _start_integer(start, "num_frames", default=33, low=1, high=self.max_frames)
        width = _start_integer(start, "width", default=128, low=16, high=self.max_size)
        height = _start_integer(start, "height", default=128, low=16, high=self.max_size)
        seed = _start_integer(start, "seed", default=0, low=0, high=MAX_SEED)
        step_seconds = _start_number(start, "step_seconds", default=0.0, low=0.0, high=MAX_DELAY)
        audio = start.get("audio", False)
        if not isinstance(audio, bool):
            raise ValueError(f"session.start: audio must be true or false, got {shown(audio)}")
        # The demo's own rules (1 + 4k frames, sides a multiple of 16), one field at a time to name it.
        for name, request in (("num_frames", (frames, 16)), ("width", (1, width)), ("height", (1, height))):
            try:
                check_demo_request(*request)
            except ValueError as error:
                raise ValueError(f"session.start: {name}: {error}") from None
        return _StandIn(self, frames, width, height, seed, step_seconds, audio).steps(
            interactions if interactions is not None else Interactions()
        )

    def check_interaction(self, interaction: Interaction) -> None:
        """A ValueError unless the stand-in can apply ``interaction``: a ``prompt`` or a ``seed``."""
        _event_seed(interaction.event)


class _StandIn:
    """One session of the stand-in: its latents (the old and the new while a transition runs) and tone."""

    def __init__(
        self,
        model: demo_generator,
        frames: int,
        width: int,
        height: int,
        seed: int,
        step_seconds: float,
        audio: bool,
    ) -> None:
        self.model = model
        self.frames, self.width, self.height = frames, width, height
        self.seed = seed
        self.step_seconds = step_seconds
        self.audio = audio
        self._phase = 0.0  # the tone's phase at the end of the last piece (continuous across pieces)
        self._samples = 0  # samples made so far
        self._frames = 0  # video frames those samples last

    async def _latent(self, seed: int) -> Tensor:
        def build() -> Tensor:
            side = demo_latent(self.frames, max(self.width, self.height), seed)
            return side[..., : self.height // 8, : self.width // 8].contiguous()

        return await anyio.to_thread.run_sync(build, limiter=self.model.limiter)

    async def steps(self, interactions: Interactions) -> AsyncIterator[RealtimePiece]:
        old = await self._latent(self.seed)
        new: Tensor | None = None  # the latent a transition goes to
        blend = 1.0  # how far the transition has gone: 1 = at ``new``
        transition: tuple[list[str], int, int] | None = None  # (event ids, first step, pieces)
        tone_seed = self.seed
        for step in range(old.shape[2]):
            if step and self.step_seconds:
                await anyio.sleep(self.step_seconds)
            started: list[str] = []
            completed: list[str] = []
            arrived = [(i, seed) for i in interactions.take() if (seed := _applied_seed(i.event)) is not None]
            if arrived:
                if transition is not None:  # a new target supersedes the one on its way
                    completed += transition[0]
                if new is not None:
                    old = old * (1 - blend) + new * blend
                last, seed = arrived[-1]
                new, tone_seed = await self._latent(seed), seed
                ids = [i.event_id for i, _ in arrived]
                started += ids
                transition = (ids, step, last.transition_chunks)
            if transition is not None and new is not None:
                ids, first, pieces = transition
                blend = min(1.0, (step - first + 1) / (pieces + 1))
                z = old[:, :, step : step + 1] * (1 - blend) + new[:, :, step : step + 1] * blend
                if blend >= 1.0:
                    completed += ids
                    old, new, transition = new, None, None
            else:
                z = old[:, :, step : step + 1]
            yield RealtimePiece(
                z.contiguous(),
                self._tone(1 if step == 0 else 4, tone_seed) if self.audio else None,
                DEMO_SAMPLE_RATE if self.audio else None,
                started,
                completed,
            )

    def _tone(self, frames: int, seed: int) -> Tensor:
        """The next ``frames`` video frames' worth of the tone, its phase carried on (no click)."""
        self._frames += frames
        until = int(Fraction(self._frames) / self.model.fps * DEMO_SAMPLE_RATE)
        count = until - self._samples
        self._samples = until
        step = 2 * math.pi * tone_hz(seed) / DEMO_SAMPLE_RATE
        phases = self._phase + step * torch.arange(1, count + 1, dtype=torch.float64)
        self._phase = float(phases[-1]) % (2 * math.pi) if count else self._phase
        return (0.25 * torch.sin(phases - step)).to(torch.float32)[None]


def _event_seed(event: Mapping[str, Any]) -> int:
    """The seed an interaction's event asks for: its ``prompt``'s (a ``null`` one is none), else its
    ``seed``; a ValueError naming the field the stand-in cannot apply."""
    prompt, seed = event.get("prompt"), event.get("seed")
    if prompt is None and seed is None:
        raise ValueError("the stand-in applies an event with a prompt (a string) or a seed (an integer)")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"event.prompt must be a string, got {shown(prompt)}")
    if seed is not None and not (is_int(seed) and 0 <= seed <= MAX_SEED):
        raise ValueError(f"event.seed must be an integer from 0 to {MAX_SEED}, got {shown(seed)}")
    return seed_of_prompt(prompt) if prompt is not None else int(event["seed"])


def _applied_seed(event: Mapping[str, Any]) -> int | None:
    """:func:`_event_seed`, or None for an event the stand-in passes over (one that reached it unchecked)."""
    try:
        return _event_seed(event)
    except ValueError:
        return None


def _start_integer(start: Mapping[str, Any], name: str, *, default: int, low: int, high: int) -> int:
    """``start[name]`` (``default`` without one), or a ValueError unless it is an integer from ``low`` to
    ``high``. JSON's integers only: ``9.0``, ``"9"`` and ``true`` are refused, not converted."""
    value = start.get(name, default)
    if not (is_int(value) and low <= value <= high):
        raise ValueError(f"session.start: {name} must be an integer from {low} to {high}, got {shown(value)}")
    return value


def _start_number(start: Mapping[str, Any], name: str, *, default: float, low: float, high: float) -> float:
    """``start[name]`` (``default`` without one), or a ValueError unless it is a number from ``low`` to
    ``high`` (JSON's numbers: not a string or a boolean)."""
    value = start.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ValueError(
            f"session.start: {name} must be a number from {low:g} to {high:g}, got {shown(value)}"
        )
    return float(value)
