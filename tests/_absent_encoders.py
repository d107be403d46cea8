"""Encoders made absent: a PyAV that cannot open the encoders named, as on a build without them.

streamvae decides what works by what PyAV can open, so the tests take encoders away where PyAV opens
them: ``av.codec.Codec`` (what the options check asks), ``av.codec.CodecContext.create`` (what the probes
open) and the ``add_stream`` of every container opened for writing (what an entry's encoder opens) raise
``UnknownCodecError`` for those names, as PyAV does for an encoder the build lacks. Everything else is
PyAV's own.

In this process: :func:`absent_encoders` (with pytest's ``monkeypatch``, undone after the test). In a
child process (the CLI, ``streamvae serve``): :func:`child_environment` puts ``tests/_absent_site`` on its
``PYTHONPATH``, whose ``sitecustomize`` calls :func:`install_from_environment` before anything imports
streamvae.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import av

if TYPE_CHECKING:
    import pytest

#: The variable a child process reads the absent encoders from (comma-separated).
ABSENT_ENV = "STREAMVAE_TEST_ABSENT_ENCODERS"
#: What a build without GPL parts and without AAC lacks (the issue's "done when" machine).
NO_GPL_NO_AAC = ("libx264", "libx265", "aac")
_SITE = Path(__file__).resolve().parent / "_absent_site"
_ROOT = Path(__file__).resolve().parent.parent


def absent_encoders(monkeypatch: pytest.MonkeyPatch, names: Iterable[str]) -> None:
    """For the rest of the test, PyAV cannot open the encoders ``names``; every probe runs afresh."""
    from streamvae import _codec_options

    for owner, attribute, value in _patches(frozenset(names)):
        monkeypatch.setattr(owner, attribute, value)
    monkeypatch.setattr(_codec_options, "_probed", {})


def install_from_environment() -> None:
    """For the whole process: PyAV cannot open the encoders :data:`ABSENT_ENV` names (if it is set)."""
    names = frozenset(name for name in os.environ.get(ABSENT_ENV, "").split(",") if name)
    if names:
        for owner, attribute, value in _patches(names):
            setattr(owner, attribute, value)


def child_environment(names: Iterable[str]) -> dict[str, str]:
    """The environment of a child process in which PyAV cannot open the encoders ``names``."""
    path = os.pathsep.join([str(_SITE), str(_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, ABSENT_ENV: ",".join(names), "PYTHONPATH": path}


def _patches(absent: frozenset[str]) -> list[tuple[Any, str, Any]]:
    real_codec, real_context, real_open = av.codec.Codec, av.codec.CodecContext, av.open

    def refuse(codec: object) -> None:
        name = codec if isinstance(codec, str) else getattr(codec, "name", None)
        if name in absent:
            raise av.codec.codec.UnknownCodecError(name)

    def codec(name: str, mode: str = "r") -> Any:
        if mode == "w":
            refuse(name)
        return real_codec(name, mode)

    class CodecContext(real_context):  # type: ignore[misc, valid-type]
        @staticmethod
        def create(codec: Any, mode: str | None = None, hwaccel: Any = None) -> Any:
            if mode == "w":
                refuse(codec)
            return real_context.create(codec, mode, hwaccel)

    def open_container(*args: Any, **kwargs: Any) -> Any:
        container = real_open(*args, **kwargs)
        mode = kwargs.get("mode", args[1] if len(args) > 1 else "r")
        return _Output(container, refuse) if mode == "w" else container

    return [
        (av.codec, "Codec", codec),
        (av.codec, "CodecContext", CodecContext),
        (av, "open", open_container),
    ]


class _Output:
    """A container opened for writing whose ``add_stream`` refuses the absent encoders; the rest is its."""

    def __init__(self, container: Any, refuse: Callable[[object], None]) -> None:
        self._container = container
        self._refuse = refuse

    def add_stream(self, codec_name: Any = None, *args: Any, **kwargs: Any) -> Any:
        self._refuse(codec_name)
        return self._container.add_stream(codec_name, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, *exc: object) -> None:
        self._container.close()
