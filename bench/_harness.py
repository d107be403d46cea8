"""Shared by the benchmarks that compare ways side by side, each run in a fresh child process.

The child measures one block (:func:`measuring`: wall and CPU time, its peak RSS after a reset, and the
peak of the ffmpeg subprocesses it starts) and prints its record as the last line of JSON; the parent runs
the ways alternately (:func:`side_by_side`, through :func:`spawn_child`) and reports medians and per-repeat
ratios. The baseline way is ``export_to_video``'s, whose x264 settings (``X264``) streamvae is given too.
Frames are counted by decoding the MP4 (``tests/_media.count_frames``), never taken from the
writer's own account.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/_media.py
from tests._media import count_frames

__all__ = [
    "X264",
    "Cost",
    "Runs",
    "SubprocessPeak",
    "count_frames",
    "measuring",
    "median",
    "memory_mib",
    "ratios",
    "reset_peak_rss",
    "side_by_side",
    "spawn_child",
    "spread",
    "written",
]

# export_to_video's defaults (quality=5) make imageio-ffmpeg ask libx264 for crf int((1 - 5/10) * 51) = 25
# and nothing else: preset medium, yuv420p; the ffmpeg CLI adds threads auto (x264: 1.5 × cores, frame
# threads). streamvae gets the same crf and preset; its threads stay its default, min(4, cores).
X264 = {"crf": "25", "preset": "medium"}
Runs = dict[str, list[dict[str, Any]]]  # way → its runs (the children's records), in the order they ran


# ---------------------------------------------------------------------------------------------------------
# In the child: what one block cost
# ---------------------------------------------------------------------------------------------------------


def memory_mib() -> tuple[float, float]:
    """(RSS now, peak RSS) of this process, MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its RSS now (Linux ``clear_refs`` 5); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class SubprocessPeak:
    """The largest summed RSS of this process's ffmpeg subprocesses (export_to_video's), sampled every
    ``interval`` seconds while the block runs. ``ru_maxrss`` of children cannot tell it: a forked child
    is charged its parent's pages until it executes ffmpeg."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.peak_mib = interval, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._done.wait(self.interval):
            total = 0
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):  # it exited between the listing and the look
                    # a forked child counts its parent's pages until it executes ffmpeg: not until then
                    if "ffmpeg" in child.name():
                        total += child.memory_info().rss
            self.peak_mib = max(self.peak_mib, total / 2**20)

    def __enter__(self) -> SubprocessPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


@dataclass
class Cost:
    """What a :func:`measuring` block cost; the fields after ``started`` are set when it ends."""

    peak_reset: bool  # False where the peak RSS could not be reset: it then includes what came before
    rss_before_mib: float
    started: float  # time.perf_counter() at the block's start
    wall: float = float("nan")
    cpu_seconds: float = float("nan")  # this process and its children (ffmpeg), user + system
    peak_rss_mib: float = float("nan")  # since the reset (or the block's own last reset, as StepEnds does)
    subprocess_peak_mib: float = 0.0  # the ffmpeg subprocesses' (processes of their own)

    def record(self) -> dict[str, Any]:
        """The fields of a child's record that every benchmark takes as they are (its peak RSS it reads
        itself: what follows a reset inside the block is the benchmark's to tell)."""
        return {
            "wall": self.wall,
            "cpu_seconds": self.cpu_seconds,
            "rss_before_mib": self.rss_before_mib,
            "peak_reset": self.peak_reset,
            "subprocess_peak_mib": self.subprocess_peak_mib,
        }


@contextlib.contextmanager
def measuring() -> Iterator[Cost]:
    """Measure the block: the peak RSS is reset first, the ffmpeg subprocesses sampled while it runs."""
    reset = reset_peak_rss()
    rss_before, _ = memory_mib()
    cpu_before = os.times()
    with SubprocessPeak() as subprocess_peak:
        cost = Cost(reset, rss_before, time.perf_counter())
        yield cost
        cost.wall = time.perf_counter() - cost.started
    cpu_after = os.times()
    cost.cpu_seconds = sum(cpu_after[:4]) - sum(cpu_before[:4])
    _, cost.peak_rss_mib = memory_mib()
    cost.subprocess_peak_mib = subprocess_peak.peak_mib


def written(path: Path) -> dict[str, int]:
    """The size of the MP4 at ``path`` and the frames it decodes to."""
    return {"bytes": path.stat().st_size, "frames": count_frames(path)}


# ---------------------------------------------------------------------------------------------------------
# In the parent: the children, side by side
# ---------------------------------------------------------------------------------------------------------


def spawn_child(command: list[str], what: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a child (``sys.executable`` + ``command``, in ``env``: by default this process's environment) and
    read its record, the last line it prints; exit with its stderr if it fails, or if its MP4 does not
    decode to the frames it expected."""
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        sys.exit(f"{what} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if "expected_frames" in result and result["frames"] != result["expected_frames"]:
        sys.exit(f"{what}: the MP4 decodes to {result['frames']} frames, not {result['expected_frames']}")
    return result


def side_by_side(
    label: str,
    ways: Iterable[str],
    repeats: int,
    run: Callable[[str], dict[str, Any]],
    summary: Callable[[dict[str, Any]], str],
) -> Runs:
    """``repeats`` runs of each way, alternating (one, the other, one, …) so that a slower spell of the
    machine falls on both; each run is printed, ``summary`` saying what it measured."""
    ways = list(ways)
    runs: Runs = {way: [] for way in ways}
    for repeat in range(repeats):
        for way in ways:
            result = run(way)
            runs[way].append(result)
            print(f"{label} {repeat + 1}/{repeats} {way}: {summary(result)}", flush=True)
    return runs


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def spread(values: list[float], unit: str, digits: int) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f} {unit}"


def ratios(values: list[float]) -> str:
    """The median ratio in bold, then each repeat's."""
    return f"**{statistics.median(values):.2f}** ({', '.join(f'{v:.2f}' for v in values)})"
