"""CUDA's one idiom that crosses threads: the ready event.

CUDA streams are per thread. A tensor written on one thread's current stream and read on another's is
safe only if the reader's stream waits for an event recorded where it was written, *before* it crossed
over: the writer's thread is the only one that knows its stream. Every hand-over of device work in
streamvae — a pushed chunk, a quantized group, a ring copy's source — records its event here.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ready_event"]


def ready_event(device: torch.device) -> Any:
    """A ``torch.cuda.Event`` after the work queued so far on this thread's current stream of ``device``,
    or None for a device that is not CUDA (nothing to wait for)."""
    if device.type != "cuda":
        return None
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(device))
    return ready
