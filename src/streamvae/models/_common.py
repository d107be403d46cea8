"""What the HunyuanVideo, LTX and CogVideoX adapters share: the decode entry point with its rules, and the
overlapping-window walk of HunyuanVideo and LTX.

:class:`ChunkedDecoder` owns the parts of :meth:`decode_with_chunks` that do not depend on the model: latent
checks, accelerate's forward hook, batch slicing and the failure rule. A family adapter subclasses it and
writes one generator, ``_entry_chunks``, that decodes a latent step by step and yields each final chunk; a
``yield`` is a step boundary, so a failed ``on_chunk`` stops the decode there.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import torch
from torch import Tensor

from streamvae.protocol import check_latents, publish_chunks

__all__ = ["ChunkedDecoder", "check_latents", "execution_device", "overlapping_window_chunks"]


class ChunkedDecoder:
    """Base of the single-process adapters: implements :class:`streamvae.SupportsChunkedVAEDecode`.

    Subclasses set ``chunk_value_range`` and implement :meth:`_entry_chunks`. ``vae`` is used as it is: same
    module, same weights, same settings (``use_slicing``, ``use_tiling``, window sizes) read at each decode.
    """

    vae: Any
    chunk_value_range: tuple[float, float] = (-1.0, 1.0)
    is_output_rank: bool = True

    def __init__(self, vae: Any, *, vae_classes: tuple[type, ...]) -> None:
        if not isinstance(vae, vae_classes):
            names = " or ".join(cls.__name__ for cls in vae_classes)
            raise TypeError(
                f"{type(self).__name__} wraps a diffusers {names}, "
                f"got {type(vae).__module__}.{type(vae).__qualname__}"
            )
        self.vae = vae
        self.latent_channels = int(self.vae.config["latent_channels"])

    def prepare_latents(self, z: Tensor) -> Tensor:
        """Check that ``z`` is a latent this VAE decodes and return it in the VAE's dtype, on its device.

        The device is the one the VAE runs on: the offload device when the weights are offloaded (they may
        sit on the CPU or the meta device until the hook moves them), else the device of the weights. Raises
        :class:`ValueError` naming the expected form for a latent that is not 5-D, has the wrong channel
        count, or is empty.
        """
        self._check_latents(z)
        return z.to(device=execution_device(self.vae), dtype=self.vae.dtype)

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        """Decode ``z`` ([batch, latent_channels, frames, height, width]) and publish each final chunk.

        The chunks concatenated along T equal ``vae.decode(z).sample`` with the instance's settings. The
        VAE's forward hook (accelerate offload) runs once, as it does around ``vae.decode``. With
        ``vae.use_slicing`` and batch > 1 the entries are decoded one at a time, as ``vae.decode`` does,
        and each published chunk still holds the whole batch. When ``on_chunk`` raises, the decode stops at
        the next step boundary, no chunk is retained, and the error is re-raised; the instance is left as it
        was and decodes correctly afterwards. Chunks may be views of a window the decode still reads (to
        blend the next one): treat them as read-only.
        """
        self._check_latents(z)
        with torch.no_grad():
            hook = getattr(self.vae, "_hf_hook", None)
            if hook is not None and hasattr(hook, "pre_forward"):
                hook.pre_forward(self.vae)  # what diffusers' apply_forward_hook does around decode
            publish_chunks(self._batch_chunks(z), on_chunk)

    def _entry_chunks(self, z: Tensor, entries: slice) -> Generator[Tensor, None, None]:
        """Yield the final chunks of ``z``, which holds the batch entries ``entries`` of the whole latent."""
        raise NotImplementedError

    def _batch_chunks(self, z: Tensor) -> Generator[Tensor, None, None]:
        batch = z.shape[0]
        if not (getattr(self.vae, "use_slicing", False) and batch > 1):
            yield from self._entry_chunks(z, slice(None))
            return
        # One walk per entry, stepped together: each step decodes every entry alone, as vae.decode does,
        # and publishes the step's frames for the whole batch.
        walks = [self._entry_chunks(z[b : b + 1], slice(b, b + 1)) for b in range(batch)]
        try:
            for step in zip(*walks, strict=True):
                yield torch.cat(step)
        finally:
            for walk in walks:
                walk.close()

    def _check_latents(self, z: Tensor) -> None:
        check_latents(z, self.latent_channels, owner=type(self).__name__)


def execution_device(vae: Any) -> torch.device:
    """The device ``vae.decode`` needs its input on (the offload hook's device when weights are offloaded)."""
    try:
        from diffusers.utils.torch_utils import get_module_execution_device
    except ImportError:  # diffusers < 0.37: accelerate's hooks are the only offload to look through
        for module in vae.modules():
            device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
            if device is not None:
                return torch.device(device)
        return torch.device(vae.device)
    return get_module_execution_device(vae)


def overlapping_window_chunks(
    vae: Any, z: Tensor, decode_window: Callable[[Tensor, bool], Tensor]
) -> Generator[Tensor, None, None]:
    """Yield the final chunks of diffusers' ``_temporal_tiled_decode`` (HunyuanVideo, LTX), one per window.

    diffusers decodes windows of ``tile_sample_min_num_frames // r + 1`` latent frames every
    ``tile_sample_stride_num_frames // r`` latents (``r`` the temporal compression), blends the last
    ``min - stride`` sample frames of each window into the first frames of the next (``vae.blend_t``, in
    place), and keeps ``stride`` sample frames of each window (``stride + 1`` of the first). A window's kept
    frames are final as soon as it is blended: a later window only reads this one's tail, which is never
    kept. So each window publishes its kept frames right away; the video is the same tensor ``decode``
    returns, trimmed like it to ``(T - 1) r + 1`` frames. Windows that only decode past that end are skipped.

    ``decode_window(latents, first)`` decodes one window the way the family does (spatial tiling included)
    and drops the frame the family drops from every window but the first.
    """
    num_frames = z.shape[2]
    ratio = vae.temporal_compression_ratio
    window = vae.tile_sample_min_num_frames // ratio + 1
    stride = vae.tile_sample_stride_num_frames // ratio
    blend = vae.tile_sample_min_num_frames - vae.tile_sample_stride_num_frames
    keep = vae.tile_sample_stride_num_frames
    remaining = (num_frames - 1) * ratio + 1

    previous: Tensor | None = None
    for start in range(0, num_frames, stride):
        if remaining <= 0:
            return
        decoded = decode_window(z[:, :, start : start + window], previous is None)
        if previous is None:
            chunk = decoded[:, :, : keep + 1]
        else:
            decoded = vae.blend_t(previous, decoded, blend)
            chunk = decoded[:, :, :keep]
        chunk = chunk[:, :, :remaining]
        remaining -= chunk.shape[2]
        previous = decoded
        if chunk.shape[2] > 0:
            yield chunk
