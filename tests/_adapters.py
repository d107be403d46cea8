"""Helpers shared by the model adapter tests: decode references, a recording stream, a counting hook."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from torch import Tensor

from streamvae.protocol import SupportsChunkedVAEDecode


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny convolutions run faster on one thread; two stall badly when another process holds a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference(vae: Any, z: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """What ``vae.decode`` gives for ``z``: the result every adapter must reproduce."""
    with torch.no_grad():
        sample: Tensor = vae.decode(z, *args, **kwargs).sample
        return sample


def stream(adapter: SupportsChunkedVAEDecode, z: Tensor) -> list[Tensor]:
    """Decode through ``adapter``; check that no chunk changed after it was published; return the chunks."""
    published: list[tuple[Tensor, Tensor]] = []
    adapter.decode_with_chunks(z, on_chunk=lambda chunk: published.append((chunk, chunk.clone())))
    for chunk, at_publish in published:
        assert torch.equal(chunk, at_publish), "a published frame changed afterwards"
    return [at_publish for _, at_publish in published]


class CountingHook(ModelHook):
    """An accelerate hook that counts ``pre_forward`` calls (what diffusers runs around ``decode``)."""

    def __init__(self) -> None:
        self.pre_forward_calls = 0

    def pre_forward(
        self, module: torch.nn.Module, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        self.pre_forward_calls += 1
        return args, kwargs


def check_hook_runs_once_per_decode(vae: Any, make_adapter: Callable[[Any], Any], z: Tensor) -> None:
    """The adapter runs the VAE's forward hook once per decode, like ``vae.decode``, and stays exact."""
    hook = CountingHook()
    add_hook_to_module(vae, hook)
    chunks = stream(make_adapter(vae), z)
    assert hook.pre_forward_calls == 1
    assert torch.equal(torch.cat(chunks, dim=2), reference(vae, z))
    assert hook.pre_forward_calls == 2  # vae.decode ran it once as well


def fail_at_second_chunk(
    vae: Any, adapter: SupportsChunkedVAEDecode, z: Tensor, error: BaseException
) -> tuple[int, list[weakref.ref[Tensor]]]:
    """Decode with an ``on_chunk`` that raises ``error`` at the second chunk.

    Checks that the very error object comes back; returns the decoder calls that ran and weak references
    to every chunk published (all of which must be dead by now).
    """
    decoder_calls: list[int] = []
    handle = vae.decoder.register_forward_hook(lambda *_: decoder_calls.append(1))
    published: list[weakref.ref[Tensor]] = []

    def on_chunk(chunk: Tensor) -> None:
        published.append(weakref.ref(chunk))
        if len(published) == 2:
            raise error

    try:
        with pytest.raises(type(error)) as raised:
            adapter.decode_with_chunks(z, on_chunk=on_chunk)
    finally:
        handle.remove()
    assert raised.value is error
    return len(decoder_calls), published
