"""Soak: does a server's memory stay flat over many requests?

Starts the server in a fresh process on 127.0.0.1 (a free port), sends ``--requests`` sequential small
requests (``/video.mp4?frames=5&size=32``, a new seed each) with httpx, and samples the server process's RSS
(psutil) after each response. ``--runs`` runs, a fresh server each, for each server:

- ``serve``: ``python -m streamvae serve`` — the entry point, with its allocator trim after each video;
- ``create_app``: ``create_app()`` under plain ``uvicorn.run`` — the library alone, nothing process-wide;
- ``serve (before)``, with ``--baseline-src DIR``: ``streamvae serve`` of an older source tree (``DIR`` is
  its ``src``, e.g. ``git archive HEAD src | tar -x -C /tmp/before`` → ``/tmp/before/src``).

The figure is the RSS slope (least squares) over the second half of the requests (500 → 1000 by default),
in MB per 100 requests, median of the runs; the goal for ``serve`` is ≤ 2. It also runs the bare encoder
loop (``EntryEncoder`` in a fresh process, 1000 MP4s of 5 frames 32×32) for both outputs, and of the
baseline too. Results go to the "soak" section of docs/benchmarks.md and docs/soak_rss.png.

    .venv/bin/python bench/soak.py --baseline-src /tmp/before/src   # 3 runs × 1000 requests per server
    .venv/bin/python bench/soak.py --requests 200 --runs 1 --no-write   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import DOCS, write_section

QUERY = "/video.mp4?frames=5&size=32&seed={seed}"
PLAIN_UVICORN = (
    "import sys, uvicorn; from streamvae.server import create_app; "
    "uvicorn.run(create_app(), host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')"
)
SERVE = [sys.executable, "-m", "streamvae", "serve", "--port"]
COMMANDS = {
    "serve": SERVE,
    "create_app": [sys.executable, "-c", PLAIN_UVICORN],
    "serve (before)": SERVE,
}


@dataclass
class Run:
    server: str
    rss_mb: list[float]  # after each request
    seconds: float

    def slope(self) -> float:
        """MB per 100 requests over the second half (least squares)."""
        start = len(self.rss_mb) // 2
        xs = list(range(start, len(self.rss_mb)))
        return statistics.linear_regression(xs, self.rss_mb[start:]).slope * 100


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(src: str | None) -> dict[str, str]:
    """This environment, with ``src`` first on the path when given (a baseline's source tree)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def soak(server: str, requests: int, src: str | None) -> Run:
    port = free_port()
    process = subprocess.Popen(
        [*COMMANDS[server], str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=DOCS.parent,
        env=child_env(src),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # the server imports torch and builds the demo VAE first
            try:
                httpx.get(f"{url}/stats", timeout=5)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{server} did not start") from None
                time.sleep(0.2)
        rss = psutil.Process(process.pid)
        samples: list[float] = []
        started = time.perf_counter()
        with httpx.Client(base_url=url, timeout=120) as client:
            for seed in range(requests):
                response = client.get(QUERY.format(seed=seed))
                if response.status_code != 200 or not response.content:
                    raise RuntimeError(f"request {seed}: {response.status_code} {response.text[:200]}")
                samples.append(rss.memory_info().rss / 1e6)
        return Run(server, samples, time.perf_counter() - started)
    finally:
        process.terminate()
        process.wait(timeout=30)


def encoder_loop(output: str, count: int) -> None:
    """Child: RSS growth over ``count`` bare encodes after a warm-up of 50."""
    from fractions import Fraction

    import numpy as np

    from streamvae._encode import EntryEncoder

    frames = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    me = psutil.Process()

    def one() -> None:
        encoder = EntryEncoder(fps=Fraction(16), output=output)  # type: ignore[arg-type]
        encoder.encode(frames)
        encoder.finish()

    for _ in range(50):
        one()
    before = me.memory_info().rss
    for _ in range(count):
        one()
    print(json.dumps({"growth_mb": (me.memory_info().rss - before) / 1e6}))


def encoder_growth(output: str, count: int, src: str | None) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--encoder-loop", output, "--count", str(count)],
        check=True,
        capture_output=True,
        text=True,
        env=child_env(src),
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["growth_mb"])


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"serve": "tab:blue", "create_app": "tab:orange", "serve (before)": "tab:gray"}
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    labelled: set[str] = set()
    for run in runs:
        label = None if run.server in labelled else run.server
        labelled.add(run.server)
        ax.plot(range(1, len(run.rss_mb) + 1), run.rss_mb, color=colors[run.server], lw=1, label=label)
    requests = len(runs[0].rss_mb)
    ax.axvspan(requests // 2, requests, color="0.9", zorder=0, label="slope window")
    ax.set_xlabel("request")
    ax.set_ylabel("server RSS (MB)")
    ax.set_title(f"RSS over {requests} sequential requests (frames=5, size=32), each run a fresh server")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--servers", default="serve,create_app", help="comma-separated: serve, create_app")
    parser.add_argument(
        "--baseline-src", help="an older tree's src: adds 'serve (before)' and its encoder loop"
    )
    parser.add_argument("--encodes", type=int, default=1000, help="bare encoder loop length (0: skip)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    parser.add_argument("--encoder-loop", choices=["mp4", "fragmented"], help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.encoder_loop:
        encoder_loop(args.encoder_loop, args.count)
        return

    trees = {"now": None} | ({"before": args.baseline_src} if args.baseline_src else {})
    loops = {
        (tree, output): encoder_growth(output, args.encodes, src)
        for tree, src in trees.items()
        for output in ("mp4", "fragmented")
        if args.encodes
    }
    for (tree, output), growth in loops.items():
        print(f"encoder loop, {output} ({tree}): {growth:+.1f} MB over {args.encodes} encodes", flush=True)
    servers = args.servers.split(",") + (["serve (before)"] if args.baseline_src else [])
    runs: list[Run] = []
    for index in range(args.runs):
        for server in servers:  # interleaved, so every server sees the same machine load
            run = soak(server, args.requests, args.baseline_src if server == "serve (before)" else None)
            runs.append(run)
            print(
                f"run {index + 1} {server}: {run.slope():+.2f} MB/100 requests, RSS {run.rss_mb[0]:.0f} → "
                f"{run.rss_mb[-1]:.0f} MB, {run.seconds / args.requests * 1000:.0f} ms/request",
                flush=True,
            )
    half = args.requests // 2
    rows = []
    for server in servers:
        mine = [r for r in runs if r.server == server]
        slopes = [r.slope() for r in mine]
        rss = [statistics.median(r.rss_mb[i] for r in mine) for i in (0, half - 1, -1)]
        per_request = statistics.median(r.seconds for r in mine) / args.requests * 1000
        rows.append(
            f"| `{server}` | **{statistics.median(slopes):+.2f}** | {', '.join(f'{s:+.2f}' for s in slopes)} | "
            f"{rss[0]:.0f} | {rss[1]:.0f} | {rss[2]:.0f} | {per_request:.0f} ms |"
        )
    table = "\n".join(rows)
    print(table)
    if args.no_write:
        return
    image = DOCS / "soak_rss.png"
    plot(runs, image)
    malloc_env = sorted(k for k in os.environ if k.startswith("MALLOC_")) or ["none"]
    loop_header = " | ".join(f"RSS growth ({tree})" for tree in trees)
    loop_rows = "\n".join(
        f"| {output} | " + " | ".join(f"{loops[tree, output]:+.1f} MB" for tree in trees) + " |"
        for output in ("mp4", "fragmented")
        if loops
    )
    before = (
        "`serve (before)` is `streamvae serve` of the tree before this work (no leak fix, no encode "
        "budget, no allocator trim)"
        if args.baseline_src
        else "no baseline was given (`--baseline-src`)"
    )
    body = f"""
## Soak: server memory over {args.requests} requests (`python bench/soak.py --baseline-src …`)

Each run starts a fresh server process on 127.0.0.1 and sends {args.requests} sequential requests
`/video.mp4?frames=5&size=32` (a new seed each) with httpx; the server's RSS (psutil) is sampled after
each response. *Slope*: least squares over requests {half} → {args.requests}, in MB per 100 requests (goal
for `streamvae serve` ≤ 2). `serve` is `python -m streamvae serve` (the entry point, with `malloc_trim(0)`
after each video response); `create_app` is `create_app()` under plain `uvicorn.run` (the library alone,
nothing process-wide); {before}. {args.runs} runs each, interleaved. `MALLOC_*` variables:
{", ".join(malloc_env)}.

| server | slope, median (MB/100 requests) | runs | RSS after request 1 (MB) | after {half} | after {args.requests} | time per request |
|---|---:|---|---:|---:|---:|---:|
{table}

A bare `EntryEncoder` loop in a fresh process ({args.encodes} encodes of 5 frames 32×32 after 50 warm-up
ones, each `finish()`ed then dropped): RSS growth. Before the fix a closed encoder still held its streams,
and through them the container and x264's state, until the encoder itself was freed; and the plain-MP4
encoder's `io_open`, a bound method, made encoder → stream → container → encoder a cycle that only the
cyclic garbage collector frees. A server's sessions are themselves freed only by that collector (a session
and its byte streams refer to each other), so every request's x264 state waited for it too: that, not
the allocator, is most of `serve (before)`'s growth (the old tree with only this fix applied stays flat).
Now closing an encoder lets go of its streams.

| output | {loop_header} |
|---|{"---:|" * len(trees)}
{loop_rows}

![server RSS per request](soak_rss.png)
"""
    print(f"wrote {write_section('soak', body)} and {image}")


if __name__ == "__main__":
    main()
