"""Joining a process group: this rank's device, and how long a decoder's waits for its peers last.

:func:`init_distributed` records the timeout it created the default group with, because some torch
versions do not report a group's timeout back (``_internals.group_timeout``);
:func:`resolve_collective_timeout` finds a decoder's deadline from what it was given, the group, that
record, and torch's defaults, in that order.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from streamvae.distributed._internals import group_timeout

_init_timeout: timedelta | None = None  # the timeout init_distributed created the default group with


def init_distributed(
    *, backend: str | None = None, timeout: timedelta = timedelta(minutes=10)
) -> torch.device:
    """Join the process group ``torchrun`` describes and return this rank's device.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (env://); run
    without torchrun it forms a group of one. On a machine with CUDA the backend defaults to NCCL and
    each rank takes a GPU of its own (``torch.cuda.set_device``): ``cuda:0`` when the process sees one
    GPU (a launcher that gives each process its own, as SLURM's GPU binding or a Kubernetes device plugin
    do), ``cuda:LOCAL_RANK`` when it sees more, and ValueError when ``LOCAL_RANK`` is not below the count
    it sees — never two ranks on one GPU by accident (NCCL also refuses ranks that share one). Without
    CUDA the backend defaults to gloo on the CPU.

    ``timeout`` bounds every collective wait: it is how long a rank waits for a dead or stuck peer before
    its decode raises, and every sharded decoder takes it as its ``collective_timeout``. Under NCCL
    it is also when PyTorch's watchdog acts on a stuck collective (by default it ends the process; see
    docs/distributed.md). Does nothing but pick and return the device if a default group already exists.
    """
    global _init_timeout
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        index = _cuda_device_for(
            local_rank, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if dist.is_initialized():
        return device
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    _init_timeout = timeout
    return device


def _cuda_device_for(local_rank: int, visible: int, visible_devices: str | None = None) -> int:
    """The index of this rank's GPU among the ``visible`` ones (``visible_devices``: CUDA_VISIBLE_DEVICES).

    One visible GPU is this process's own (the launcher hid the others); with more, ``LOCAL_RANK`` picks
    one. A ``LOCAL_RANK`` without a GPU of its own raises ValueError rather than share another rank's.
    """
    if visible == 1 and local_rank >= 0:
        return 0
    if 0 <= local_rank < visible:
        return local_rank
    raise ValueError(
        f"LOCAL_RANK={local_rank} has no GPU of its own: this process sees {visible} GPU(s) "
        f"(CUDA_VISIBLE_DEVICES={visible_devices!r}); start at most one process per visible GPU, "
        "or give each process its own GPU"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def resolve_collective_timeout(group: dist.ProcessGroup | None, given: timedelta | None) -> timedelta:
    """``given``, else the decode group's own timeout, else torch's default for its backend."""
    if given is not None:
        return given
    own = group_timeout(group)
    if own is not None:
        return own
    if _init_timeout is not None and (group is None or group is dist.group.WORLD):
        return _init_timeout
    nccl = "nccl" in str(dist.get_backend(group)).lower()
    default = dist.constants.default_pg_nccl_timeout if nccl else None
    return default or dist.constants.default_pg_timeout
