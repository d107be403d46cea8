"""ChunkedDecoder and as_decoder: one surface for every decoder, whatever it implements itself."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from streamvae import SupportsChunkedVAEDecode
from streamvae.models import ChunkedDecoder, ProtocolDecoder, as_decoder
from streamvae.models.wan import WanChunkedDecoder
from tests._adapters import FrameDecoder, FrameVAE
from tests._vaes import latent, tiny_wan21


class Minimal:
    """Only what the protocol asks."""

    chunk_value_range = (0.0, 1.0)

    def __init__(self) -> None:
        self.decoded: list[Tensor] = []

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        self.decoded.append(z)
        on_chunk(torch.zeros(z.shape[0], 3, 1, 2, 2))


class Described(Minimal):
    """The protocol and every optional attribute."""

    latent_channels = 4
    is_output_rank = False

    def prepare_latents(self, z: Tensor) -> Tensor:
        return z.double()


def test_as_decoder_gives_a_chunked_decoder_as_it_is_and_adapts_a_diffusers_vae() -> None:
    decoder = FrameDecoder(FrameVAE())
    assert as_decoder(decoder) is decoder
    vae = tiny_wan21()
    adapter = as_decoder(vae)
    assert isinstance(adapter, WanChunkedDecoder) and adapter.vae is vae
    assert isinstance(adapter, SupportsChunkedVAEDecode)


def test_as_decoder_refuses_what_is_no_decoder_and_options_it_cannot_pass() -> None:
    with pytest.raises(TypeError, match=r"as_decoder: vae must be .* got torch\.nn\.modules\.linear\.Linear"):
        as_decoder(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="temb apply only to a diffusers VAE"):
        as_decoder(Minimal(), temb=torch.zeros(1))


def test_a_protocol_only_decoder_gets_the_defaults() -> None:
    inner = Minimal()
    decoder = as_decoder(inner)
    assert isinstance(decoder, ProtocolDecoder) and decoder.decoder is inner
    assert (decoder.chunk_value_range, decoder.latent_channels, decoder.is_output_rank) == (
        (0, 1),
        None,
        True,
    )
    assert (decoder.vae, decoder.drain, decoder.takes_pieces) == (None, False, False)
    z = torch.zeros(1, 7, 2, 2, 2)
    assert decoder.prepare_latents(z) is z
    chunks: list[Tensor] = []
    decoder.decode_with_chunks(z, on_chunk=chunks.append)
    assert inner.decoded == [z] and len(chunks) == 1
    with pytest.raises(ValueError, match="ProtocolDecoder: z must be a 5-D latent"):
        decoder.decode_with_chunks(z[0], on_chunk=chunks.append)
    assert inner.decoded == [z]  # checked before the wrapped decoder saw it


def test_a_protocol_only_decoder_keeps_its_optional_attributes() -> None:
    decoder = as_decoder(Described())
    assert (decoder.latent_channels, decoder.is_output_rank) == (4, False)
    assert decoder.prepare_latents(torch.zeros(1, 4, 1, 2, 2)).dtype == torch.float64
    with pytest.raises(ValueError, match=r"4 latent channels .*\[batch, 4, frames, height, width\]"):
        decoder.prepare_latents(torch.zeros(1, 3, 1, 2, 2))


def test_a_protocol_only_decoder_cannot_be_stepped() -> None:
    decoder = as_decoder(Minimal())
    with pytest.raises(TypeError, match="Minimal implements only decode_with_chunks"):
        decoder.iter_chunks(torch.zeros(1, 4, 1, 2, 2))
    with pytest.raises(TypeError, match="cannot decode latents in pieces"):
        decoder.start(1, 2, 2)


def test_steps_run_without_autograd_and_on_chunk_in_the_callers_grad_mode() -> None:
    grad_modes: list[bool] = []

    def on_chunk(chunk: Tensor) -> None:
        grad_modes.append(torch.is_grad_enabled())
        assert not chunk.requires_grad

    with torch.enable_grad():
        FrameDecoder(FrameVAE()).decode_with_chunks(torch.zeros(1, 4, 3, 2, 2), on_chunk=on_chunk)
    assert grad_modes == [True, True, True]


@pytest.mark.parametrize("family", ["one generator", "wan"])
def test_iter_chunks_keeps_no_chunk_it_yielded(family: str) -> None:
    if family == "wan":
        vae = tiny_wan21()
        vae.enable_slicing()
        decoder: ChunkedDecoder = WanChunkedDecoder(vae)
        z = latent(vae, batch=2, frames=2, h=4, w=4)
    else:
        decoder, z = FrameDecoder(FrameVAE()), torch.zeros(1, 4, 2, 2, 2)
    chunks = decoder.iter_chunks(z)
    chunk = weakref.ref(next(chunks))
    gc.collect()
    assert chunk() is None  # between steps, only the consumer decides what stays alive
    chunks.close()


def test_a_family_adapter_refuses_other_modules_by_name() -> None:
    class Family(ChunkedDecoder):
        vae_classes = (FrameVAE,)

    with pytest.raises(
        TypeError, match="Family wraps a diffusers FrameVAE, got torch.nn.modules.linear.Linear"
    ):
        Family(torch.nn.Linear(1, 1))


def test_importing_the_models_package_does_not_import_diffusers() -> None:
    code = "import sys, streamvae.models; assert 'diffusers' not in sys.modules, 'diffusers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
