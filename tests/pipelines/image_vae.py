"""The pipelines that decode video frame by frame with an image VAE (AutoencoderKL): AnimateDiff, I2VGenXL, PIA, text-to-video SD."""

from __future__ import annotations
