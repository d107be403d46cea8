"""The sharded decode running in a thread: what every hook on the decoder's layers reads and leaves.

The hooks are registered once on the shared decoder's layers (``_hooks``) and act only while
:func:`active` has made a :class:`ShardContext` this thread's sharded decode of that decoder; anywhere
else (another thread, another decoder) :func:`context_for` answers None and they return at once, so a
plain decode of the same module is unaffected. A hook that changes a layer's input records here what the
hook after the layer must undo.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from streamvae.distributed._layout import StripLayout
from streamvae.distributed._stats import ShardedDecodeStats


class Gathers(Protocol):
    """What the hooks need from the decode group: one all_gather, and the counters it bumps."""

    stats: ShardedDecodeStats

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        """Every rank's ``tensor`` (one shape on every rank), in rank order."""
        ...


@dataclass
class ShardContext:
    """The sharded decode running in this thread: what the decoder's hooks need."""

    decoder: nn.Module
    layout: StripLayout
    comm: Gathers
    crops: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(layer) -> rows to drop after it
    shapes: dict[int, torch.Size] = field(default_factory=dict)  # id(layer) -> its input shape, unaligned
    extra_rows: dict[int, int] = field(default_factory=dict)  # id(conv) -> rows the whole frame has beyond


_local = threading.local()


@contextmanager
def active(context: ShardContext) -> Iterator[None]:
    """Make ``context`` the sharded decode of this thread while the block runs."""
    _local.context = context
    try:
        yield
    finally:
        _local.context = None
        context.crops.clear()
        context.shapes.clear()
        context.extra_rows.clear()


def context_for(decoder: nn.Module) -> ShardContext | None:
    """This thread's sharded decode of ``decoder``, or None (none running, or one of another decoder)."""
    context: ShardContext | None = getattr(_local, "context", None)
    if context is None or context.decoder is not decoder:
        return None
    return context
