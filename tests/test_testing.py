"""streamvae.testing: the conformance suite passes good decoders and names what a bad one breaks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from torch import Tensor

from streamvae import publish_chunks
from streamvae.testing import check_chunked_decoder, open_containers
from tests._adapters import FrameDecoder, FrameVAE
from tests._vaes import latent, tiny_wan21


@pytest.fixture
def vae() -> FrameVAE:
    vae = FrameVAE()
    add_hook_to_module(vae, ModelHook())  # so the suite counts the hook's calls
    return vae


def frames(batch: int = 1, count: int = 3) -> Tensor:
    return torch.randn(batch, 4, count, 2, 2, generator=torch.Generator().manual_seed(1))


class PlainDecoder:
    """A decoder that implements only the protocol, on ``publish_chunks``: the way the README suggests."""

    chunk_value_range = (-1.0, 1.0)

    def __init__(self, vae: FrameVAE) -> None:
        self.vae = vae

    def chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        for k in range(z.shape[2]):
            yield self.vae.frame(z[:, :, k : k + 1])

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        with torch.no_grad():
            publish_chunks(self.chunks(z), on_chunk)


# What passes


def test_a_family_written_as_one_generator_conforms(vae: FrameVAE) -> None:
    report = check_chunked_decoder(FrameDecoder(vae), frames(), reference=vae.decode_frames)
    assert report.chunk_frames == [2, 2, 2]
    assert report.decoder_calls == [1, 2, 3]


def test_slicing_and_draining_conform(vae: FrameVAE) -> None:
    vae.use_slicing = True
    z = frames(batch=2)
    entries = torch.cat([vae.decode_frames(z[b : b + 1]) for b in range(2)])  # each decoded alone
    report = check_chunked_decoder(FrameDecoder(vae, drain=True), z, reference=entries)
    assert report.decoder_calls == [2, 4, 6]


def test_a_protocol_only_decoder_conforms_without_step_counts(vae: FrameVAE) -> None:
    z = frames()
    report = check_chunked_decoder(PlainDecoder(vae), z, reference=vae.decode_frames(z))
    assert report.chunk_frames == [2, 2, 2] and report.decoder_calls is None


def test_a_diffusers_vae_is_checked_through_its_adapter_pieces_included() -> None:
    wan = tiny_wan21()
    report = check_chunked_decoder(
        wan, latent(wan, frames=2, h=4, w=4), reference=lambda z: wan.decode(z).sample
    )
    assert report.chunk_frames == [1, 4]


def test_tolerance_accepts_chunks_near_the_reference(vae: FrameVAE) -> None:
    def near(z: Tensor) -> Tensor:
        return vae.decode_frames(z) + 1e-6

    with pytest.raises(AssertionError, match=r"differ from the reference: frames \[0, 1, 2, 3, 4, 5\]"):
        check_chunked_decoder(FrameDecoder(vae), frames(), reference=near)
    check_chunked_decoder(FrameDecoder(vae), frames(), reference=near, atol=1e-5)


def test_the_container_leak_check_finds_none_open_between_tests() -> None:
    assert open_containers() == 0


# What fails, and how the failure reads


class RetainingDecoder(FrameDecoder):
    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        for chunk in super().entry_chunks(z, entries):
            self.last = chunk  # a published chunk outlives the failed decode
            yield chunk


class OverwritingDecoder(FrameDecoder):
    def entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        buffer: Tensor | None = None
        for chunk in super().entry_chunks(z, entries):
            if buffer is not None:
                buffer.copy_(chunk)  # reuses the memory of a chunk already published
                chunk = buffer
            buffer = chunk
            yield chunk


class DoubleHookDecoder(FrameDecoder):
    def iter_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        self.run_forward_hook()
        return super().iter_chunks(z)


class UncheckedDecoder(FrameDecoder):
    def check_latents(self, z: object, *, owner: str | None = None) -> None:
        pass


class DecodingOnDecoder(FrameDecoder):
    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        publish_chunks(self.iter_chunks(z), on_chunk, drain=True)  # while claiming drain=False


class RetryingDecoder(PlainDecoder):
    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        errors = []
        with torch.no_grad():
            for chunk in self.chunks(z):
                try:
                    on_chunk(chunk)
                except BaseException as error:
                    errors.append(error)
        if errors:
            raise errors[0]


class SwallowingDecoder(PlainDecoder):
    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        with contextlib.suppress(BaseException):
            super().decode_with_chunks(z, on_chunk=on_chunk)


class WrappingDecoder(PlainDecoder):
    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        try:
            super().decode_with_chunks(z, on_chunk=on_chunk)
        except BaseException as error:
            raise RuntimeError("decode failed") from error


class GradDecoder(PlainDecoder):
    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        publish_chunks(self.chunks(z), on_chunk)  # no torch.no_grad: chunks hold the autograd graph


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (RetainingDecoder, r"kept chunks \[0\] alive after a decode whose on_chunk raised _OnChunkError"),
        (OverwritingDecoder, "changed chunk 0 after publishing it"),
        (DoubleHookDecoder, "ran the VAE's forward hook 2 times in a decode whose on_chunk raised"),
        (UncheckedDecoder, "check_latents accepted a numpy array"),
        (DecodingOnDecoder, "ran 3 decoder steps in a decode whose on_chunk raised .* at chunk 0, 1 before"),
        (
            RetryingDecoder,
            "called on_chunk 3 times in a decode whose on_chunk raised _OnChunkError at chunk 0",
        ),
        (SwallowingDecoder, "returned normally from a decode whose on_chunk raised"),
        (WrappingDecoder, "raised RuntimeError.*not that error"),
        (GradDecoder, "published chunk 0 with an autograd graph"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_a_broken_rule_raises_an_assertion_naming_it(
    vae: FrameVAE, make: Callable[[FrameVAE], Any], message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        check_chunked_decoder(make(vae), frames(), reference=vae.decode_frames)


def test_the_wrong_shape_or_no_chunk_at_all_is_named(vae: FrameVAE) -> None:
    z = frames()
    with pytest.raises(
        AssertionError, match=r"published \(1, 3, 6, 2, 2\).*the reference is \(1, 3, 5, 2, 2\)"
    ):
        check_chunked_decoder(FrameDecoder(vae), z, reference=vae.decode_frames(z)[:, :, :5])

    class Silent(PlainDecoder):
        def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
            pass

    with pytest.raises(AssertionError, match="published no chunk"):
        check_chunked_decoder(Silent(vae), z, reference=vae.decode_frames)
