"""Every video VAE class of diffusers' video pipelines, through the public entry points.

Each family's own test file checks its walk against ``vae.decode``; here every class in
``models.supported_classes()`` is taken by ``chunked_decoder`` and by ``decode_to_mp4`` given the plain
diffusers instance (the registry's way in), and the MP4 decodes to every frame of the decode, at its size,
with its pixels (lossless luma within a level of the decode's, quantized in the family's value range). A
class streamvae does not decode is a TypeError that lists the ones it does. What several families share is
checked here once for all of them: the adapter ``chunked_decoder`` picks and what it says of its latents, and
the walk of the families that decode the whole clip in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from diffusers import AutoencoderTiny
from torch import Tensor

import streamvae
from streamvae.models import ChunkedDecoder, chunked_decoder, supported_classes
from streamvae.models.allegro import AllegroChunkedDecoder
from streamvae.models.cogvideox import CogVideoXChunkedDecoder
from streamvae.models.cosmos import CosmosChunkedDecoder
from streamvae.models.hunyuan_video import HunyuanVideoChunkedDecoder
from streamvae.models.hunyuan_video15 import HunyuanVideo15ChunkedDecoder
from streamvae.models.image_vae import ImageVAEChunkedDecoder
from streamvae.models.kandinsky6 import Kandinsky6SRChunkedDecoder
from streamvae.models.kvae import KVAEVideoChunkedDecoder
from streamvae.models.ltx_video import LTXVideoChunkedDecoder
from streamvae.models.magvit import MagvitChunkedDecoder
from streamvae.models.minimax_h3 import IMAGENET_RANGE, MiniMaxH3ChunkedDecoder
from streamvae.models.mochi import MochiChunkedDecoder
from streamvae.models.stable_video import StableVideoChunkedDecoder
from streamvae.models.wan import WanChunkedDecoder
from streamvae.testing import TINY_VAE_CONFIGS
from tests import _vaes
from tests._adapters import check_whole_clip
from tests._media import bt709_luma, read_luma
from tests.pipelines.image_vae import tiny_autoencoder_kl

#: the diffusers VAE classes of diffusers 0.42.1's video pipelines (the image VAE AutoencoderKL and
#: Kandinsky6SRVAE among them) and KVAE, with the tiny test VAE of each and a latent it decodes
#: [channels, latent frames, height, width]
FAMILIES: dict[str, tuple[Callable[[], Any], tuple[int, int, int, int]]] = {
    "AutoencoderKLWan": (_vaes.tiny_wan21, (16, 3, 4, 4)),
    "AutoencoderKLQwenImage": (_vaes.tiny_qwen_image, (16, 3, 4, 4)),
    "AutoencoderKLHunyuanVideo": (_vaes.tiny_hunyuan_video, (4, 3, 2, 2)),
    "AutoencoderKLLTXVideo": (_vaes.tiny_ltx_video, (8, 3, 2, 2)),
    "AutoencoderKLLTX2Video": (_vaes.tiny_ltx2_video, (8, 3, 2, 2)),
    "AutoencoderKLCogVideoX": (_vaes.tiny_cogvideox, (4, 3, 2, 2)),
    "AutoencoderKLMiniMaxH3": (_vaes.tiny_minimax_h3, (4, 7, 4, 4)),
    "AutoencoderKLHunyuanVideo15": (_vaes.tiny_hunyuan_video15, (4, 3, 2, 2)),
    "AutoencoderKLMochi": (_vaes.tiny_mochi, (12, 2, 2, 2)),
    "AutoencoderKLAllegro": (_vaes.tiny_allegro, (4, 4, 4, 7)),
    "AutoencoderKLCosmos": (_vaes.tiny_cosmos, (4, 2, 2, 2)),
    "AutoencoderKLMagvit": (_vaes.tiny_magvit, (4, 3, 2, 2)),
    "AutoencoderKLTemporalDecoder": (_vaes.tiny_stable_video, (4, 3, 4, 4)),
    "AutoencoderKLKVAEVideo": (_vaes.tiny_kvae, (4, 6, 2, 2)),
    "AutoencoderKL": (tiny_autoencoder_kl, (4, 3, 4, 4)),
    "Kandinsky6SRVAE": (_vaes.tiny_kandinsky6_sr, (4, 6, 2, 2)),
}

#: the adapter ``chunked_decoder`` wraps each class in
ADAPTERS: dict[str, type[ChunkedDecoder]] = {
    "AutoencoderKLWan": WanChunkedDecoder,
    "AutoencoderKLQwenImage": WanChunkedDecoder,
    "AutoencoderKLHunyuanVideo": HunyuanVideoChunkedDecoder,
    "AutoencoderKLLTXVideo": LTXVideoChunkedDecoder,
    "AutoencoderKLLTX2Video": LTXVideoChunkedDecoder,
    "AutoencoderKLCogVideoX": CogVideoXChunkedDecoder,
    "AutoencoderKLMiniMaxH3": MiniMaxH3ChunkedDecoder,
    "AutoencoderKLHunyuanVideo15": HunyuanVideo15ChunkedDecoder,
    "AutoencoderKLMochi": MochiChunkedDecoder,
    "AutoencoderKLAllegro": AllegroChunkedDecoder,
    "AutoencoderKLCosmos": CosmosChunkedDecoder,
    "AutoencoderKLMagvit": MagvitChunkedDecoder,
    "AutoencoderKLTemporalDecoder": StableVideoChunkedDecoder,
    "AutoencoderKLKVAEVideo": KVAEVideoChunkedDecoder,
    "AutoencoderKL": ImageVAEChunkedDecoder,
    "Kandinsky6SRVAE": Kandinsky6SRChunkedDecoder,
}
#: the classes whose adapter decodes latents that arrive in pieces (its decoder is causal across calls)
TAKES_PIECES = {"AutoencoderKLWan", "AutoencoderKLQwenImage", "AutoencoderKLKVAEVideo", "Kandinsky6SRVAE"}


def family_latent(shape: tuple[int, int, int, int], batch: int = 1) -> Tensor:
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(0))


def whole_video(adapter: ChunkedDecoder, z: Tensor) -> Tensor:
    """The family's decode, BCTHW: its adapter's chunks (each family's tests compare them to vae.decode)."""
    return torch.cat(list(adapter.iter_chunks(z)), dim=2)


def test_every_video_vae_class_of_the_pipelines_is_supported() -> None:
    assert sorted(FAMILIES) == supported_classes()


@pytest.mark.parametrize("class_name", sorted(FAMILIES))
def test_chunked_decoder_takes_each_class_and_says_whether_it_streams(class_name: str) -> None:
    factory, _ = FAMILIES[class_name]
    vae = factory()
    assert type(vae).__name__ == class_name
    adapter = chunked_decoder(vae)
    assert adapter.vae is vae and isinstance(vae, adapter.vae_classes)
    assert isinstance(adapter.streams, bool)


@pytest.mark.parametrize("class_name", sorted(FAMILIES))
def test_chunked_decoder_wraps_each_class_in_its_familys_adapter_which_describes_its_latents(
    class_name: str,
) -> None:
    factory, shape = FAMILIES[class_name]
    vae = factory()
    adapter = chunked_decoder(vae)
    assert type(adapter) is ADAPTERS[class_name] and adapter.vae is vae
    pixels = IMAGENET_RANGE if class_name == "AutoencoderKLMiniMaxH3" else (-1, 1)
    assert (adapter.chunk_value_range, adapter.latent_channels, adapter.is_output_rank) == (
        pixels,
        shape[0],
        True,
    )
    # A decoder that is not causal across calls refuses latents in pieces, naming the families that take them.
    assert adapter.takes_pieces == (class_name in TAKES_PIECES)
    if adapter.takes_pieces:
        adapter.check_takes_pieces()
    else:
        with pytest.raises(TypeError, match="cannot decode latents in pieces .*AutoencoderKLWan"):
            adapter.start(1, *shape[2:])


@pytest.mark.anyio
@pytest.mark.parametrize("class_name", sorted(FAMILIES))
async def test_decode_to_mp4_takes_the_plain_instance_and_writes_every_frame(class_name: str) -> None:
    factory, shape = FAMILIES[class_name]
    vae = factory()
    z = family_latent(shape, batch=2)  # a video an entry
    with torch.no_grad():
        expected = whole_video(chunked_decoder(vae), z)
    options = {"threads": "1", "crf": "0"}  # lossless luma
    videos = await streamvae.decode_to_mp4(vae, z, fps=8, video_codec_options=options)
    assert len(videos) == 2
    levels = streamvae.quantize_chunk(expected, chunked_decoder(vae).chunk_value_range)
    for entry, video in enumerate(videos):
        luma = read_luma(video).astype(int)
        assert luma.shape == (expected.shape[2], *expected.shape[3:])
        assert abs(luma - bt709_luma(levels.numpy()[entry]).astype(int)).max() <= 1  # the decode's pixels
    known = chunked_decoder(vae).output_frames(shape[1])
    assert known in (None, expected.shape[2])


#: the families whose decoder takes the whole clip in one call → the frames each later latent frame gives
WHOLE_CLIP = {"AutoencoderKLCosmos": 8, "AutoencoderKLMochi": 6}


@pytest.mark.parametrize("class_name", sorted(WHOLE_CLIP))
@pytest.mark.parametrize(
    ("batch", "latent_frames", "use_slicing"), [(1, 3, None), (1, 1, None), (2, 2, False), (2, 2, True)]
)
def test_a_whole_clip_family_decodes_in_one_call_then_hands_on_a_latent_frame_of_the_whole_batch_a_chunk(
    class_name: str, batch: int, latent_frames: int, use_slicing: bool | None
) -> None:
    factory, (channels, _, height, width) = FAMILIES[class_name]
    z = family_latent((channels, latent_frames, height, width), batch=batch)
    frames = [1] + [WHOLE_CLIP[class_name]] * (latent_frames - 1)
    check_whole_clip(chunked_decoder(factory()), z, frames, use_slicing=use_slicing)


def test_the_tiny_configs_build_their_classes() -> None:
    import diffusers

    classes = {
        "kvae": "AutoencoderKLKVAEVideo",
        "mochi": "AutoencoderKLMochi",
        "cosmos": "AutoencoderKLCosmos",
        "magvit": "AutoencoderKLMagvit",
        "stable_video": "AutoencoderKLTemporalDecoder",
        "allegro": "AutoencoderKLAllegro",
        "minimax_h3": "AutoencoderKLMiniMaxH3",
        "hunyuan_video15": "AutoencoderKLHunyuanVideo15",
    }
    for key, class_name in classes.items():
        vae = getattr(diffusers, class_name)(**TINY_VAE_CONFIGS[key])
        assert sum(p.numel() for p in vae.parameters()) < 2_000_000, key  # tiny: decodes in a blink


def test_a_class_streamvae_does_not_decode_is_a_type_error_listing_every_supported_one() -> None:
    tiny = AutoencoderTiny(
        encoder_block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        num_encoder_blocks=(1,),
        num_decoder_blocks=(1,),
    )
    with pytest.raises(TypeError, match="supported diffusers classes") as caught:
        chunked_decoder(tiny)
    assert all(name in str(caught.value) for name in FAMILIES)


@pytest.mark.parametrize("class_name", sorted(FAMILIES))
def test_each_adapter_refuses_another_module_naming_the_class_it_wraps(class_name: str) -> None:
    adapter_type = type(chunked_decoder(FAMILIES[class_name][0]()))
    with pytest.raises(TypeError, match=f"wraps a diffusers .*{class_name}.*, got torch.nn"):
        adapter_type(torch.nn.Linear(1, 1))
