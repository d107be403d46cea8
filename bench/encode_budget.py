"""The server's shared encode budget: 16 concurrent requests against the same 16 run one after another.

The app runs under uvicorn in a thread of this process (``create_app`` with the demo VAE) and httpx sends
16 requests (``/video.mp4?frames=33&size=128``, a seed each) either all at once (8 decode, 8 queue: the
default ``max_concurrent``) or one after another, alternately, ``--repeats`` times, for two apps:

- ``shared budget``: the default ``create_app()``: one ``CapacityLimiter`` of ``os.cpu_count()`` tokens for
  every session's encoder calls, x264 ``threads`` 1;
- ``no budget``: each session on its own, as before the budget: a limiter no request ever waits on and
  x264 ``threads`` min(4, cores), the library's default.

What it counts: every ``EntryEncoder.encode`` / ``finish`` / ``close`` call is wrapped; *encoder threads at
work* is the sum, over the calls in flight, of the x264 ``threads`` option of their encoder (the threads
that call may keep busy), and its peak over the run is compared with the budget's tokens. *OS threads* is
the process's thread count sampled every 5 ms (it includes idle worker threads and x264's own pools).
Throughput ratio: sequential wall time over concurrent wall time of the same 16 requests (> 1: the
concurrent run is faster), medians. Results go to the "encode budget" section of docs/benchmarks.md.

    .venv/bin/python bench/encode_budget.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from _report import write_section

from streamvae._encode import EntryEncoder
from streamvae.server import create_app
from tests._server import running_server

REQUESTS = 16
QUERY = "/video.mp4?frames=33&size=128&seed={seed}"
CORES = os.cpu_count() or 1


@dataclass
class Meter:
    """Encoder threads at work (the wrapped calls in flight × their ``threads``), and their peak."""

    at_work: int = 0
    peak: int = 0
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.peak = self.at_work
            self.calls = 0


METER = Meter()


def _counted(method: Any) -> Any:
    def call(self: EntryEncoder, *args: Any) -> Any:
        threads = int(self.codec_options.get("threads", "0")) or CORES  # 0: x264 picks by the cores
        with METER.lock:
            METER.at_work += threads
            METER.peak = max(METER.peak, METER.at_work)
            METER.calls += 1
        try:
            return method(self, *args)
        finally:
            with METER.lock:
                METER.at_work -= threads

    return call


for _name in ("encode", "finish", "close"):
    setattr(EntryEncoder, _name, _counted(getattr(EntryEncoder, _name)))


def apps() -> dict[str, Any]:
    return {
        "shared budget": create_app(max_queued=REQUESTS),
        "no budget": create_app(
            max_queued=REQUESTS,
            encode_limiter=anyio.CapacityLimiter(10**6),
            session_options={"video_codec_options": {"threads": str(min(4, CORES))}},
        ),
    }


@dataclass
class Measure:
    seconds: float
    cpu_seconds: float  # user + system time of the whole process
    peak_encoder_threads: int
    peak_os_threads: int


async def run(url: str, concurrent: bool) -> Measure:
    me = psutil.Process()
    peak_os = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_os
        while not done.wait(0.005):
            peak_os = max(peak_os, me.num_threads())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    METER.reset()
    limits = httpx.Limits(max_connections=REQUESTS)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def get(seed: int) -> None:
            response = await client.get(QUERY.format(seed=seed))
            assert response.status_code == 200 and response.content, response.text[:200]

        started, cpu = time.perf_counter(), sum(me.cpu_times()[:2])
        if concurrent:
            async with anyio.create_task_group() as group:
                for seed in range(REQUESTS):
                    group.start_soon(get, seed)
        else:
            for seed in range(REQUESTS):
                await get(seed)
        seconds, cpu = time.perf_counter() - started, sum(me.cpu_times()[:2]) - cpu
    done.set()
    sampler.join()
    return Measure(seconds, cpu, METER.peak, peak_os)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    results: dict[tuple[str, bool], list[Measure]] = {}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(running_server(app)) for name, app in apps().items()}
        for url in urls.values():
            anyio.run(run, url, False)  # warm-up: the first decodes pay for lazy initialisation
        for _ in range(args.repeats):
            for name, url in urls.items():  # interleaved, so every case sees the same machine load
                for concurrent in (True, False):
                    measure = anyio.run(run, url, concurrent)
                    results.setdefault((name, concurrent), []).append(measure)
                    kind = "concurrent" if concurrent else "sequential"
                    print(
                        f"{name}, {kind}: {measure.seconds:.2f} s, CPU {measure.cpu_seconds:.2f} s, "
                        f"encoder threads at work ≤ {measure.peak_encoder_threads}, "
                        f"OS threads ≤ {measure.peak_os_threads}",
                        flush=True,
                    )

    def median(name: str, concurrent: bool, what: str) -> float:
        return statistics.median(getattr(m, what) for m in results[name, concurrent])

    rows = []
    for name in ("shared budget", "no budget"):
        budget = (
            f"{CORES} tokens, x264 threads 1"
            if name == "shared budget"
            else f"none, x264 threads {min(4, CORES)}"
        )
        ratios = [
            s.seconds / c.seconds for c, s in zip(results[name, True], results[name, False], strict=True)
        ]
        rows.append(
            f"| {name} ({budget}) | {median(name, True, 'seconds'):.2f} s | {median(name, False, 'seconds'):.2f} s | "
            f"**{statistics.median(ratios):.2f}×** ({', '.join(f'{r:.2f}' for r in ratios)}) | "
            f"**{max(m.peak_encoder_threads for m in results[name, True])}** | "
            f"{max(m.peak_os_threads for m in results[name, True])} / {max(m.peak_os_threads for m in results[name, False])} | "
            f"{median(name, True, 'cpu_seconds'):.1f} / {median(name, False, 'cpu_seconds'):.1f} s |"
        )
    cross = [
        s.seconds / c.seconds
        for c, s in zip(results["shared budget", True], results["no budget", False], strict=True)
    ]
    table = "\n".join(rows)
    print(table)
    print(f"shared budget concurrent vs no budget sequential: {statistics.median(cross):.2f}×")
    if args.no_write:
        return
    body = f"""
## Encode budget: 16 concurrent requests vs one after another (`python bench/encode_budget.py`)

The app under uvicorn in a thread of the benchmark's process ({CORES} cores), 16 requests
`/video.mp4?frames=33&size=128` (a seed each) sent all at once (8 decode, 8 wait: `max_concurrent=8`) or
one after another, {args.repeats} times each, the four cases interleaved (both apps serve at once, on two
ports), after a warm-up of 16 sequential requests each. *Shared budget* is the
default `create_app()`: one `CapacityLimiter` of `os.cpu_count()` tokens shared by every session's encoder
calls, x264 `threads` 1. *No budget* is how the server ran before it: no limiter shared between sessions
(one nobody waits on) and x264 `threads` min(4, cores).

*Encoder threads at work* counts the `EntryEncoder.encode` / `finish` / `close` calls in flight, each
weighted by its encoder's x264 `threads` option (the threads that call can keep busy; the rgb24 → yuv420p
conversion runs in the calling thread); the peak over the concurrent runs is given. With `threads` 1 x264
encodes inside the call (no frame or lookahead thread of its own), so with the budget the count is exact
and can never pass the tokens; with more threads x264's frame threads go on working between calls, so the
*no budget* figure is a lower bound. *OS threads* is the process's thread count sampled every 5 ms (idle pool threads
included), concurrent / sequential; so is the process's CPU time (user + system). *Throughput ratio*: sequential ÷ concurrent wall time of the same 16
requests, per repeat (> 1: the concurrent run is faster).

| app | concurrent, median | sequential, median | **throughput ratio** (runs) | peak encoder threads at work (concurrent) | peak OS threads | process CPU time, median |
|---|---:|---:|---:|---:|---:|---:|
{table}

The shared budget's concurrent run against the *no budget* sequential run (the previous one-at-a-time
baseline, with x264's own threads): {statistics.median(cross):.2f}× ({", ".join(f"{r:.2f}" for r in cross)}).
"""
    print(f"wrote {write_section('encode budget', body)}")


if __name__ == "__main__":
    main()
