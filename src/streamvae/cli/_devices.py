"""The devices ``decode --device`` takes: those this machine has, checked when the option is parsed.

A device torch cannot name (``gpu``) or this machine lacks (``cuda`` on a CPU-only torch build) would
otherwise fail deep inside the VAE's load as a long traceback, after the latents were read. torch is
imported only here, when ``--device`` is given or its default is needed.
"""

from __future__ import annotations

import argparse
from typing import Any

# Accelerators whose torch module (torch.cuda, torch.xpu, torch.mps) answers is_available / device_count.
_ACCELERATORS = ("cuda", "xpu", "mps")


def parse_device(text: str) -> str:
    """``--device``'s value if this machine has the device (``cpu``, ``cuda``, ``cuda:1``), else an
    :class:`argparse.ArgumentTypeError` naming the forms it has."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: expected {_device_forms()}") from None
    if device.type == "cpu":
        return text
    count = _device_count(device.type)
    if count == 0:
        problem = f"this torch ({torch.__version__}) sees no {device.type} device"
    elif device.index is not None and device.index >= count:
        problem = f"this machine has {count} {device.type} device{'s' if count > 1 else ''}"
    else:
        return text
    raise argparse.ArgumentTypeError(f"{text}: {problem}; expected {_device_forms()}")


def default_device() -> str:
    """``--device``'s default: the first CUDA device where there is one, else the CPU."""
    return "cuda" if _device_count("cuda") else "cpu"


def _device_count(kind: str) -> int:
    import torch

    backend: Any = getattr(torch, kind, None)
    available = torch.backends.mps.is_available if kind == "mps" else getattr(backend, "is_available", None)
    if available is None or not available():
        return 0
    count: int = backend.device_count()
    return count


def _device_forms() -> str:
    """The devices ``--device`` takes here, in words: ``cpu``, or ``cpu, cuda or cuda:0 … cuda:1``."""
    forms = ["cpu"]
    for kind in _ACCELERATORS:
        count = _device_count(kind)
        if count:
            forms.append(f"{kind} or {kind}:0" + (f" … {kind}:{count - 1}" if count > 1 else ""))
    return ", ".join(forms)
