"""The core tiny diffusers pipelines (tests/pipelines) run, are deterministic, and give the documented shapes.

tests/test_generate.py checks that streamvae decodes each one's latents as its own VAE does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.pipelines import CORE, EXPECTED

names = pytest.mark.parametrize("name", list(CORE))


@names
def test_frames_have_the_documented_shape_and_range(name: str) -> None:
    pipe, make_kwargs = CORE[name]()
    frames = pipe(**make_kwargs(), output_type="np").frames
    assert isinstance(frames, np.ndarray)
    assert frames.shape == EXPECTED[name].frames
    assert frames.dtype == np.float32
    assert frames.min() >= 0.0
    assert frames.max() <= 1.0
    assert frames.std() > 0.01  # a video, not a flat field


@names
def test_fresh_generators_give_identical_videos(name: str) -> None:
    pipe, make_kwargs = CORE[name]()
    first = pipe(**make_kwargs(), output_type="np").frames
    second = pipe(**make_kwargs(), output_type="np").frames
    np.testing.assert_array_equal(first, second)


@names
def test_latent_output_has_the_documented_shape(name: str) -> None:
    pipe, make_kwargs = CORE[name]()
    latents = pipe(**make_kwargs(), output_type="latent").frames
    assert isinstance(latents, torch.Tensor)
    assert tuple(latents.shape) == EXPECTED[name].latents
    assert latents.dtype == torch.float32
