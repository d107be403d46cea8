"""StableVideoChunkedDecoder: each ``decode_chunk_size`` frames, published as soon as their call returns.

A tiny random-weight ``AutoencoderKLTemporalDecoder`` (2× spatial, one frame per latent frame). The
reference is ``StableVideoDiffusionPipeline.decode_latents`` on the pipeline's latent layout [B, F, C, H, W],
repeated here operation for operation (importing the pipeline imports transformers, whose heap makes every
garbage collection of the conformance suite slow); the last test checks the copy against the original.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_temporal_decoder import AutoencoderKLTemporalDecoder
from torch import Tensor

from streamvae.models.stable_video import StableVideoChunkedDecoder
from tests._adapters import check_decode_chunk_size_passed_on, conforms
from tests._vaes import tiny_stable_video as tiny_vae


def pipeline_latents(batch: int = 1, frames: int = 6, size: int = 4, seed: int = 0) -> Tensor:
    """What the pipeline denoises and returns with ``output_type="latent"``: [B, F, C, H, W]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, 4, size, size, generator=generator)


def denormalize(vae: AutoencoderKLTemporalDecoder, latents: Tensor) -> Tensor:
    """The pipeline's step before ``vae.decode``, in the adapter's BCTHW layout."""
    z: Tensor = 1 / vae.config["scaling_factor"] * latents
    return z.transpose(1, 2)


def decode_latents(vae: AutoencoderKLTemporalDecoder, latents: Tensor, decode_chunk_size: int) -> Tensor:
    """``StableVideoDiffusionPipeline.decode_latents``, BCTHW float32."""
    num_frames = latents.shape[1]
    latents = 1 / vae.config["scaling_factor"] * latents.flatten(0, 1)
    with torch.no_grad():
        frames = [
            vae.decode(
                latents[i : i + decode_chunk_size], num_frames=latents[i : i + decode_chunk_size].shape[0]
            ).sample
            for i in range(0, latents.shape[0], decode_chunk_size)
        ]
    return torch.cat(frames).reshape(-1, num_frames, *frames[0].shape[1:]).permute(0, 2, 1, 3, 4).float()


@pytest.mark.parametrize(
    ("frames", "decode_chunk_size", "sizes"),
    [(7, 3, [3, 3, 1]), (6, 5, [5, 1]), (3, 1, [1, 1, 1])],
)
def test_chunks_equal_the_pipelines_decode_one_call_each(
    frames: int, decode_chunk_size: int, sizes: list[int]
) -> None:
    vae = tiny_vae()
    latents = pipeline_latents(frames=frames)
    adapter = StableVideoChunkedDecoder(vae, decode_chunk_size=decode_chunk_size)
    report = conforms(
        adapter, denormalize(vae, latents), expected=decode_latents(vae, latents, decode_chunk_size)
    )
    assert report.chunk_frames == sizes
    assert report.decoder_calls == list(range(1, len(sizes) + 1))  # one decoder call a chunk
    assert adapter.streams


@pytest.mark.parametrize("decode_chunk_size", [None, 9])
def test_one_call_hands_its_frames_on_one_at_a_time(decode_chunk_size: int | None) -> None:
    vae = tiny_vae()
    latents = pipeline_latents(frames=4)
    adapter = StableVideoChunkedDecoder(vae, decode_chunk_size=decode_chunk_size)
    report = conforms(adapter, denormalize(vae, latents), expected=decode_latents(vae, latents, 4))
    assert report.chunk_frames == [1, 1, 1, 1] and report.decoder_calls == [1, 1, 1, 1]
    assert adapter.streams is (decode_chunk_size is not None)


def test_a_call_mixes_its_frames_so_none_is_final_before_it_returns() -> None:
    """Why a call is the step: changing a call's last frame changes its first."""
    vae = tiny_vae()
    latents = pipeline_latents(frames=4)
    moved = latents.clone()
    moved[:, 3] += 1.0
    full, changed = decode_latents(vae, latents, 2), decode_latents(vae, moved, 2)
    assert torch.equal(changed[:, :, :2], full[:, :, :2])  # another call: untouched
    assert not torch.equal(changed[:, :, 2], full[:, :, 2])


@pytest.mark.parametrize(
    ("decode_chunk_size", "sizes", "use_slicing"), [(3, [3, 3], False), (4, [4, 2], True)]
)
def test_a_step_decodes_the_same_frames_of_every_entry(
    decode_chunk_size: int, sizes: list[int], use_slicing: bool
) -> None:
    vae = tiny_vae()
    vae.use_slicing = use_slicing  # vae.decode ignores it, and so does the adapter
    latents = pipeline_latents(batch=2)
    z = denormalize(vae, latents)
    # the exact reference: vae.decode of each step's frames of both entries, flattened as the pipeline does
    steps = []
    with torch.no_grad():
        for start in range(0, 6, decode_chunk_size):
            step = z[:, :, start : start + decode_chunk_size]
            flat = step.transpose(1, 2).flatten(0, 1)
            frames = vae.decode(flat, num_frames=step.shape[2]).sample
            steps.append(frames.reshape(2, step.shape[2], *frames.shape[1:]).transpose(1, 2))
    report = conforms(
        StableVideoChunkedDecoder(vae, decode_chunk_size=decode_chunk_size), z, expected=torch.cat(steps, 2)
    )
    assert [tuple(chunk.shape[:3]) for chunk in report.chunks] == [(2, 3, n) for n in sizes]
    assert report.decoder_calls == list(range(1, len(sizes) + 1))  # the whole batch in each call
    # each entry is the pipeline's decode of that entry alone: bit for bit on this CPU (batched kernels
    # may differ in the last bits elsewhere)
    output = torch.cat(report.chunks, dim=2)
    for entry in range(2):
        alone = decode_latents(vae, latents[entry : entry + 1], decode_chunk_size)
        assert torch.equal(output[entry : entry + 1], alone)
    if decode_chunk_size == 4:  # the pipeline's own batch-2 decode joins entry 0's last frames to entry 1's
        assert not torch.equal(output, decode_latents(vae, latents, decode_chunk_size))


@pytest.mark.parametrize("decode_chunk_size", [0, -1, 1.5, "2", True])
def test_decode_chunk_size_must_be_a_positive_int(decode_chunk_size: Any) -> None:
    with pytest.raises(ValueError, match="StableVideoChunkedDecoder: decode_chunk_size must be an int >= 1"):
        StableVideoChunkedDecoder(tiny_vae(), decode_chunk_size=decode_chunk_size)


def test_vae_decode_is_unchanged_after_a_decode() -> None:
    vae = tiny_vae()
    z = denormalize(vae, pipeline_latents())
    flat = z.transpose(1, 2).flatten(0, 1)
    with torch.no_grad():
        expected = vae.decode(flat, num_frames=6).sample
        StableVideoChunkedDecoder(vae, decode_chunk_size=2).decode_with_chunks(z, on_chunk=lambda chunk: None)
        assert torch.equal(vae.decode(flat, num_frames=6).sample, expected)


def test_registry_returns_the_adapter_with_its_chunk_size() -> None:
    check_decode_chunk_size_passed_on(tiny_vae(), StableVideoChunkedDecoder, 3, 2, 2)


@pytest.mark.parametrize(("batch", "decode_chunk_size"), [(1, 4), (2, 4)])
def test_the_reference_is_the_pipelines_decode_latents(batch: int, decode_chunk_size: int) -> None:
    from diffusers.pipelines.stable_video_diffusion.pipeline_stable_video_diffusion import (
        StableVideoDiffusionPipeline,
    )

    vae = tiny_vae()
    latents = pipeline_latents(batch=batch)
    with torch.no_grad():
        pipeline = SimpleNamespace(vae=vae)  # decode_latents reads only the VAE
        original = StableVideoDiffusionPipeline.decode_latents(
            pipeline,  # type: ignore[arg-type]
            latents,
            num_frames=latents.shape[1],
            decode_chunk_size=decode_chunk_size,
        )
    assert torch.equal(decode_latents(vae, latents, decode_chunk_size), original)
