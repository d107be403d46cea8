"""Many viewers of one generation: what they cost the generator and the server, and what they see.

Three measures (issue 34's benchmark), each against its goal:

1. **Fan-out.** One generation (:func:`streamvae.stream_mp4` of the demo VAE's seeded latent, every piece
   published to a :class:`streamvae.server.Broadcast` as the owner's path does) with 0, 10, 100 and 1,000
   viewers, each a task on the same event loop reading as fast as it can (``async for`` over
   ``broadcast.viewer()``, joined before the first piece, so each gets every byte). Each round is a fresh
   child process that runs every count once after a warm-up generation, the order turned from round to
   round, so that a slower spell of the machine falls on all of them (a process a run would spend most of
   the time importing torch). Reported: the generator's wall time (first step to ``end()``) as a ratio
   against none, median and per round (goal: at most 1.10× at 100); the process's CPU (user + system,
   until the last viewer finished reading) over the run without viewers, per viewer; its peak RSS; the
   Python heap's peak (tracemalloc, first round) with 1,000 viewers over none, per viewer; viewers that
   got every byte, and viewers cut off.
2. **First frame for a viewer who joins live.** Viewers join at moments spread over a generation made at
   the pace it plays: in process, ``viewer()`` of a Broadcast whose pieces are published no earlier than
   their media time; through the app, WebSocket spectators (``/v1/videos/{id}/watch``) of a real-time
   request. Measured: from joining to holding the init segment and the first part (the bytes PyAV decodes
   a frame from; checked), and how far behind the newest written frame that first frame is (media
   seconds: it starts at the newest keyframe).
3. **hls.js's latency in Chromium.** The app (``create_app``) under uvicorn, a real-time request
   (``/video.mp4?realtime=1``) written two ways (:data:`HLS_RUNS`: a faster generator paced by the
   server, and one at about real time) and headless chromium playing its ``live.m3u8`` with hls.js 1.7
   and the page's settings (``tests._browser.play_hls``: ``lowLatencyMode`` and page.html's
   ``holdNearTheEdge``), then once each way with hls.js's own (:data:`HLS_DEFAULTS`) for comparison
   (``--hls-only`` runs just these with the page's settings, ``--hls-config JSON`` with others). On each
   ``timeupdate`` while the video is live the page asks
   ``GET /v1/videos`` for the frames written and records ``frames / fps − currentTime``: how far the
   picture is behind the newest written part; with hls.js's own target and ``latency`` and its stalls.
   Goal: at most ``PART-HOLD-BACK`` + one part. Skipped (said so in the section) where chromium or hls.js
   is missing.

Results go to the "broadcast" section of docs/benchmarks.md and docs/broadcast.png.

    .venv/bin/python bench/broadcast.py                # the default run: ~2 minutes on 2 cores
    .venv/bin/python bench/broadcast.py --repeats 1 --no-write   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from _harness import Runs, measuring, median, ratios, spawn_child, spread
from _report import DOCS, label_panel, table_head, write_section

VIEWERS = (0, 10, 100, 1000)
FRAMES, SIZE, FPS = 81, 128, 16  # 21 latent frames, ~5 s of video
KEYFRAME_INTERVAL = 16  # a keyframe a second
GOAL_RATIO = 1.10  # the generator's wall time with 100 viewers, against none
JOINERS = 12  # live joiners in the first-frame measure
HLS_FRAMES, HLS_SIZE = 129, 64  # the hls.js runs: 33 steps of the real-time stand-in, ~8 s of video
#: the hls.js player joins once this segment is complete: a video under way
JOIN_SEGMENT = 2
#: runs of each way, alternating: one run on this shared machine can stall where another does not
HLS_REPEATS = 2
#: the settings of the one run of each way for comparison: hls.js's own (``lowLatencyMode``, its default
#: too), without the page's ``holdNearTheEdge`` (tests/_browser.py's ``HLS_LOW_LATENCY``)
HLS_DEFAULTS: dict[str, Any] = {"lowLatencyMode": True}
#: the hls.js runs, by how the video is written: (the stand-in's seconds a step, of 4 frames, 0.25 s of video;
#: create_app's ``pace``, which sends, and so publishes, each fragment no earlier than its media time)
HLS_RUNS: dict[str, tuple[float, bool]] = {
    "paced": (0.2, True),  # a generator faster than real time, the server publishing at the video's pace
    "unpaced": (0.25, False),  # a generator at about real time (a step 0.25 s, plus its own work)
}


# ---------------------------------------------------------------------------------------------------------
# 1. Fan-out (in the child)
# ---------------------------------------------------------------------------------------------------------


class _Generator:
    """The demo VAE and its latent, built once a child; :meth:`run` makes one generation."""

    def __init__(self) -> None:
        from streamvae.demo import demo_latent, demo_vae

        self.vae, self.z = demo_vae(), demo_latent(FRAMES, SIZE, seed=0)
        self.options = {"fps": FPS, "keyframe_interval": KEYFRAME_INTERVAL}

    async def run(self, viewers: int) -> dict[str, Any]:
        """One generation published to a Broadcast with ``viewers`` readers on this loop; what it cost."""
        from streamvae import stream_mp4
        from streamvae.server import Broadcast, ViewerCutOffError

        broadcast = Broadcast()
        received = [0] * viewers
        cut_off = 0

        async def view(index: int, *, task_status: anyio.abc.TaskStatus[None]) -> None:
            nonlocal cut_off
            async with broadcast.viewer() as reader:
                task_status.started()
                try:
                    async for data in reader:
                        received[index] += len(data)
                except ViewerCutOffError:
                    cut_off += 1

        with measuring() as cost:
            async with anyio.create_task_group() as tasks:
                for index in range(viewers):
                    await tasks.start(view, index)  # every viewer is in before the first piece
                started = time.perf_counter()
                async with stream_mp4(self.vae, self.z, **self.options) as (video,):
                    async for piece in video.pieces():
                        broadcast.publish(piece)
                broadcast.end()
                generator_wall = time.perf_counter() - started
        whole = broadcast.mp4_bytes()
        frames = _decoded_frames(whole)
        if frames != FRAMES:
            raise RuntimeError(f"the generation decodes to {frames} frames, not {FRAMES}")
        return {
            **cost.record(),
            "generator_wall": generator_wall,
            "peak_rss_mib": cost.peak_rss_mib,
            "viewers": viewers,
            "pieces": len(broadcast.parts),
            "cut_off": cut_off,
            "complete": sum(size == len(whole) for size in received),  # viewers that got every byte
        }


async def _round(order: list[int], traced: bool) -> dict[str, Any]:
    """A child's round: one generation for each viewer count in ``order``, after a warm-up one; with
    ``traced``, then the Python heap's peak (tracemalloc) of a generation with none and with the most."""
    generator = _Generator()
    await generator.run(0)  # warm-up: the threads, the codec, the allocator
    records = [await generator.run(n) for n in order]
    heap: dict[str, float] = {}
    if traced:
        for n in (0, VIEWERS[-1]):
            tracemalloc.start()
            await generator.run(n)
            heap[str(n)] = tracemalloc.get_traced_memory()[1] / 1024
            tracemalloc.stop()
    return {"records": records, "heap_peak_kib": heap}


def _decoded_frames(data: bytes) -> int:
    import av

    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def _fan_out(repeats: int) -> tuple[Runs, dict[str, float]]:
    """``repeats`` rounds, each a fresh child running every viewer count (the order turned each round);
    the runs by count, and the first round's traced heap peaks."""
    runs: Runs = {str(n): [] for n in VIEWERS}
    heap: dict[str, float] = {}
    for repeat in range(repeats):
        order = list(VIEWERS[repeat % len(VIEWERS) :] + VIEWERS[: repeat % len(VIEWERS)])
        command = [__file__, "--child", ",".join(map(str, order)), *(["--traced"] if repeat == 0 else [])]
        result = spawn_child(command, f"round {repeat + 1}")
        heap = heap or result["heap_peak_kib"]
        for record in result["records"]:
            runs[str(record["viewers"])].append(record)
            print(
                f"fan-out {repeat + 1}/{repeats} {record['viewers']} viewers: generator"
                f" {record['generator_wall']:.2f} s, cpu {record['cpu_seconds']:.2f} s,"
                f" {record['complete']}/{record['viewers']} whole, {record['cut_off']} cut off",
                flush=True,
            )
    return runs, heap


def _first_frame_time(data: bytes) -> float | None:
    """The media time of the first frame ``data`` (a fragmented MP4's start) decodes to, if any."""
    import av

    with av.open(io.BytesIO(data)) as container:
        frame = next(container.decode(video=0), None)
        return None if frame is None or frame.time is None else float(frame.time)


# ---------------------------------------------------------------------------------------------------------
# 2. First frame for a live joiner (in this process)
# ---------------------------------------------------------------------------------------------------------


async def _live_joins() -> list[dict[str, float]]:
    """A generation published at its media pace; ``JOINERS`` viewers join spread over it."""
    from streamvae import stream_mp4
    from streamvae.demo import demo_latent, demo_vae
    from streamvae.server import Broadcast

    vae, z = demo_vae(), demo_latent(FRAMES, SIZE, seed=2)
    pieces = []
    async with stream_mp4(vae, z, fps=FPS, keyframe_interval=KEYFRAME_INTERVAL) as (video,):
        pieces = [piece async for piece in video.pieces()]
    broadcast = Broadcast()
    joins: list[dict[str, float]] = []
    length = float(sum((p.duration for p in pieces), Fraction(0)))

    async def join() -> None:
        entered = time.perf_counter()
        newest = broadcast.frames / FPS
        got: list[bytes] = []
        async with broadcast.viewer() as reader:
            async for data in reader:
                got.append(data)
                if len(got) >= 2:  # the init segment and the first part, which starts with a keyframe
                    break
        seconds = time.perf_counter() - entered
        part = next(p for p in broadcast.parts if p.data == got[1])
        if _decoded_frames(b"".join(got)) < 1 or not part.keyframe:
            raise RuntimeError(f"a live joiner's first bytes do not decode to a frame: part {part.index}")
        joins.append({"ms": seconds * 1000, "behind": newest - float(part.start)})

    async with anyio.create_task_group() as tasks:
        begun = anyio.current_time()
        due = [length * (i + 1) / (JOINERS + 1) for i in range(JOINERS)]
        written = Fraction(0)
        for piece in pieces:
            while due and due[0] <= written and broadcast.parts:
                due.pop(0)
                tasks.start_soon(join)
            written += piece.duration
            await anyio.sleep_until(begun + float(written))  # no earlier than its media time
            broadcast.publish(piece)
        broadcast.end()
    return joins


@contextlib.contextmanager
def _realtime_generation(frames: int, step: float, **app: Any) -> Iterator[tuple[str, Any, str]]:
    """A real-time request of ``frames`` (a step every ``step`` seconds) of the app (``create_app(**app)``)
    under uvicorn, its owner reading it in a thread: the app's URL, an httpx client of it, the video's id."""
    import httpx

    from streamvae.server import create_app
    from tests._server import running_server

    query = f"/video.mp4?frames={frames}&size={HLS_SIZE}&seed=0&realtime=1&delay={step}"
    with (
        running_server(create_app(**app)) as url,
        httpx.Client(base_url=url, timeout=120) as client,
        client.stream("GET", query) as response,
    ):
        owner = threading.Thread(target=response.read, daemon=True)
        owner.start()
        yield url, client, response.headers["link"].split("/v1/videos/", 1)[1].split("/", 1)[0]
        owner.join(timeout=120)


def _spectator_joins() -> list[dict[str, float]]:
    """The same through the app: WebSocket spectators (``/v1/videos/{id}/watch``, websocket-client) join
    a real-time request of the app under uvicorn one after another, ``JOINERS`` times spread over it; each
    measures from opening the connection to holding the init segment and its first part."""
    import websocket  # websocket-client

    joins: list[dict[str, float]] = []
    length = FRAMES / FPS
    with _realtime_generation(FRAMES, 0.25) as (url, client, video_id):
        begun = time.perf_counter()
        for join in range(JOINERS):
            time.sleep(max(0.0, begun + length * (join + 1) / (JOINERS + 2) - time.perf_counter()))
            listed = client.get("/v1/videos").json()["videos"]
            newest = next(v["frames"] for v in listed if v["id"] == video_id) / FPS
            entered = time.perf_counter()
            socket = websocket.create_connection(f"ws{url[4:]}/v1/videos/{video_id}/watch", timeout=60)
            try:
                got: list[bytes] = []
                while len(got) < 2:  # the init segment, then the first part
                    message = socket.recv()
                    if isinstance(message, bytes):
                        got.append(message)
            finally:
                socket.close()
            seconds = time.perf_counter() - entered
            first = _first_frame_time(b"".join(got))
            if first is None:
                raise RuntimeError("a spectator's first bytes do not decode to a frame")
            joins.append({"ms": seconds * 1000, "behind": newest - first})
    return joins


# ---------------------------------------------------------------------------------------------------------
# 3. hls.js's latency in Chromium
# ---------------------------------------------------------------------------------------------------------

# Samples, on each timeupdate while the video is live, how far the picture is behind the newest written
# part; resolves with the samples once the video has ended (or the generation has ended and it stalls).
SAMPLE_LATENCY = """
new Promise((resolve, reject) => {
  const video = document.getElementById("hls-video");
  const state = window.hlsState;
  const samples = [];
  let asking = false;
  video.addEventListener("timeupdate", async () => {
    if (asking || state.playingAt === null) return;
    asking = true;
    const position = video.currentTime;
    const listed = (await (await fetch("/v1/videos")).json()).videos.find((v) => v.id === VIDEO_ID);
    if (listed.state === "live") {
      const hls = window.hls;
      samples.push({
        written: listed.frames / FPS, position, hls: hls.latency, target: hls.targetLatency, now: performance.now(),
      });
    }
    asking = false;
  });
  video.addEventListener("ended", () => resolve({samples, state}));
  setTimeout(() => reject(new Error("hls.js did not end in 90 s: " + JSON.stringify(state))), 90000);
})
"""


def _hls_latency(step: float, pace: bool, config: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """hls.js playing a real-time generation (``step``, ``pace``: see :data:`HLS_RUNS`) in chromium: the
    latency samples and the playlist's timing; None where chromium or hls.js is missing."""
    from tests._browser import HLS_JS, headless_chromium, page_at, play_hls

    chromium = shutil.which("chromium")
    if chromium is None or not HLS_JS.is_file():
        return None
    with (
        tempfile.TemporaryDirectory() as profile,
        headless_chromium(chromium, Path(profile)) as address,
        _realtime_generation(HLS_FRAMES, step, hls_js=HLS_JS, pace=pace) as (url, client, video_id),
    ):
        # The player joins a video under way: once segment JOIN_SEGMENT is complete (blocking reload, asked
        # a segment at a time: further ahead is a 400).
        playlist = f"/v1/videos/{video_id}/live.m3u8"
        for sequence in range(JOIN_SEGMENT + 1):
            while (reply := client.get(playlist, params={"_HLS_msn": sequence})).status_code == 503:
                pass  # the hold's bound passed first: ask again, as a player does
            reply.raise_for_status()
        with page_at(address, f"{url}/v1/videos") as devtools:
            devtools.evaluate(play_hls(f"/v1/videos/{video_id}/live.m3u8", config))
            result: dict[str, Any] = devtools.evaluate(
                SAMPLE_LATENCY.replace("VIDEO_ID", json.dumps(video_id)).replace("FPS", str(FPS))
            )
    state = result["state"]
    if state["fatal"]:
        raise RuntimeError(f"hls.js: {state['fatal']}")
    samples = result["samples"]
    return {
        "page": config is None,  # the page's settings, or ``config``
        "latencies": [s["written"] - s["position"] for s in samples],
        "positions": [s["position"] for s in samples],
        "hls_latencies": [s["hls"] for s in samples if s["hls"] is not None],
        "targets": [s["target"] for s in samples if s["target"] is not None],
        "stalls": state["stalls"],
        "seeks": state["seeks"],  # hls.js's seeks once playing (its gap controller's, after a stall)
        "began": state["playingAt"],  # the position it began to play at
        # video seconds written per second while it was sampled: below 1 the player catches up and stalls
        "pace": (samples[-1]["written"] - samples[0]["written"])
        / (samples[-1]["now"] - samples[0]["now"])
        * 1e3,
        "part_target": state["partTarget"],
        "part_hold_back": state["partHoldBack"],
        "segment": state["segment"],
        "version": state["version"],
    }


# ---------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------


def _fan_out_rows(runs: Runs, heap: dict[str, float]) -> tuple[list[str], dict[int, list[float]]]:
    base = runs["0"]
    wall_ratios: dict[int, list[float]] = {}
    lines = table_head(
        "viewers | generator wall (median) | against none: median (each round) | process CPU (median)"
        " | peak RSS (median) | got every byte / cut off"
    )
    for n in VIEWERS:
        these = runs[str(n)]
        wall_ratios[n] = [r["generator_wall"] / b["generator_wall"] for r, b in zip(these, base, strict=True)]
        lines.append(
            f"| {n:,} | {median(these, 'generator_wall'):.2f} s | {ratios(wall_ratios[n])}"
            f" | {median(these, 'cpu_seconds'):.2f} s | {median(these, 'peak_rss_mib'):.0f} MiB"
            f" | {min(r['complete'] for r in these)}/{n} / {max(r['cut_off'] for r in these)} |"
        )
    most = str(VIEWERS[-1])
    pieces = base[0]["pieces"]
    # per viewer from the most viewers: with fewer the difference is within the machine's noise
    n = VIEWERS[-1]
    extra = median(runs[str(n)], "cpu_seconds") - median(base, "cpu_seconds")
    lines += [
        "",
        f"CPU per viewer, over the run without viewers, at {n:,} viewers: {extra / n * 1e3:.2f} ms for the whole"
        f" generation, {extra / n / pieces * 1e6:.1f} µs a part (with fewer viewers the difference is within"
        f" this machine's noise). At {n:,} that is {extra:.2f} s in all, on the event loop the generator's"
        " pieces pass through too: that is what slows it there.",
    ]
    if heap:
        per_viewer = (heap[most] - heap["0"]) / int(most)
        lines += [
            f"Memory per viewer: the Python heap's peak (tracemalloc) over a generation with {int(most):,}"
            f" viewers, less one with none, per viewer: **{per_viewer:.1f} KiB** ({heap['0'] / 1024:.1f} →"
            f" {heap[most] / 1024:.1f} MiB). A viewer holds references to the broadcast's bytes, not copies.",
        ]
    return lines, wall_ratios


def _report(
    runs: Runs,
    heap: dict[str, float],
    joins: dict[str, list[dict[str, float]]],
    hls: dict[str, dict[str, Any]],
    repeats: int,
    seconds: float,
) -> tuple[str, dict[int, list[float]]]:
    fan_out, wall_ratios = _fan_out_rows(runs, heap)
    at_100 = statistics.median(wall_ratios[100])
    pieces = runs["0"][0]["pieces"]
    lines = [
        "## Broadcast: many viewers of one generation (`python bench/broadcast.py`)",
        "",
        f"One generation ({FRAMES} frames {SIZE}×{SIZE} of the demo VAE, a keyframe every {KEYFRAME_INTERVAL}"
        f" frames, {pieces} pieces) published to a `Broadcast` with 0, 10, 100 and 1,000 viewers, each a task",
        f"on the same event loop reading as fast as it can. {repeats} rounds, each a fresh process that runs",
        "every count after a warm-up generation, the order turned each round. The generator's wall time is",
        "its first step to `end()`; the process's CPU (user + system) runs until the last viewer has read",
        "everything, given per viewer over the run without viewers; the peak RSS is reset before each run.",
        "",
        *fan_out,
        "",
        f"**Goal: at most {GOAL_RATIO:.2f}× with 100 viewers: {at_100:.2f}× "
        f"({'met' if at_100 <= GOAL_RATIO else 'missed'}).** A viewer costs the generator one list append a",
        "piece (`publish` never waits for one); its reading is its own task's.",
        "",
        "**First frame for a viewer who joins live**: joins spread over a generation made at the pace it",
        "plays; from joining to holding the init segment and the first part (PyAV decodes a frame from",
        "them), and how far that frame is behind the newest frame written when it joined:",
        "",
        *table_head("viewer | joins | first frame: median (range) | behind the newest frame: median (range)"),
        *(
            f"| {way} | {len(these)} | {statistics.median(j['ms'] for j in these):.2f} ms"
            f" ({spread([j['ms'] for j in these], 'ms', 2)}) | {statistics.median(j['behind'] for j in these):.2f}"
            f" s ({spread([j['behind'] for j in these], 's', 2)}) |"
            for way, these in joins.items()
        ),
        "",
        "A live joiner waits for nothing: it starts at the newest keyframe, already written, so its first",
        f"frame is up to a keyframe interval ({KEYFRAME_INTERVAL / FPS:g} s here) behind the newest.",
        "",
    ]
    if not hls:
        lines.append("**hls.js in Chromium**: not measured (chromium or hls.js is missing on this machine).")
    else:
        first = next(iter(hls.values()))
        goal = first["part_hold_back"] + first["part_target"]
        parts_frames = first["part_target"] * FPS
        page_runs = {name: run for name, run in hls.items() if run["page"]}
        own_runs = {name: run for name, run in hls.items() if not run["page"]}
        lines += [
            f"**hls.js {first['version']} in headless Chromium**, with the page's settings (`lowLatencyMode` and"
            " page.html's `holdNearTheEdge`, which tests/_browser.py plays with too: 1.5× while more than a part",
            "behind hls.js's target with over a part buffered ahead, and one part added to the target after a",
            "stall, `liveSyncOnStallIncrease`), and once each way with hls.js's own settings (`lowLatencyMode` only), for comparison. It plays the `live.m3u8` of a"
            f" real-time request ({HLS_FRAMES} frames {HLS_SIZE}×{HLS_SIZE}), written two ways: *paced*, the"
            " stand-in generator faster than real time",
            "(a step of 4 frames every 0.2 s) and the app sending, so publishing, each fragment at its media",
            "time (`create_app(pace=True)`); *unpaced*, the generator at about real time (a step every 0.25 s,",
            f"plus its own work) and no pacing. The player joins once segment {JOIN_SEGMENT} is complete; on each",
            "`timeupdate` while the video was live: the newest",
            "written part's end (`GET /v1/videos`' frames / fps) less the player's `currentTime`. Goal: at most",
            f"PART-HOLD-BACK ({first['part_hold_back']:g} s) + one part (PART-TARGET {first['part_target']:g} s)"
            f" = {goal:.2f} s. Stalls are `waiting` events and seeks `seeking` events (hls.js's own, skipping a hole after a stall), once it played.",
            "",
            *table_head(
                "written | pace against real time | began at | samples | min | median | 90th percentile"
                " | max | hls.js's target | its own `latency` (median) | stalls | seeks"
            ),
        ]
        for name, run in hls.items():
            latencies = run["latencies"]
            p90 = statistics.quantiles(latencies, n=10)[-1] if len(latencies) >= 2 else latencies[0]
            lines.append(
                f"| {name} | {run['pace']:.2f}× | {run['began']:.2f} s | {len(latencies)} | {min(latencies):.2f} s"
                f" | {statistics.median(latencies):.2f} s | {p90:.2f} s | {max(latencies):.2f} s"
                f" | {statistics.median(run['targets']):.2f} s | {statistics.median(run['hls_latencies']):.2f} s"
                f" | {run['stalls']} | {run['seeks']} |"
            )
        medians = {name: statistics.median(run["latencies"]) for name, run in page_runs.items()}
        verdicts = ", ".join(
            f"{name} {'met' if median <= goal else 'missed'} ({median:.2f} s)"
            for name, median in medians.items()
        )
        every = all(median <= goal for median in medians.values())
        own = ", ".join(f"{statistics.median(run['latencies']):.2f} s" for run in own_runs.values())
        lines += [
            "",
            f"**Goal, at the median, with the page's settings: {'met' if every else 'missed'}**: {verdicts}."
            + (f" With hls.js's own settings: {own}." if own else ""),
            "",
            "What sets it: hls.js aims at PART-HOLD-BACK behind its playlist's edge, but it loads from an",
            f"INDEPENDENT part (a keyframe; tests/test_browser_hls.py sees its first part so), up to a segment"
            f" ({first['segment']:g} s)",
            "back, and begins late, the edge moving on while those parts load. On its own it never makes the",
            "difference up: it plays faster only with more than 1 s buffered ahead (its `latency-controller`,",
            "`maxLiveSyncPlaybackRate`), which a player this close to the newest part never has, and each stall",
            "adds 1 s to its target (`liveSyncOnStallIncrease`). The page's settings play it at 1.5× until it is",
            "within a part of its target (about a second after it begins) and add one part after a stall; they",
            "never jump (a seek past the buffered parts, hls.js's `liveMaxLatencyDuration`, once left a gap it",
            "never played across). What is left is stalls: the player reached the newest part. *Unpaced*, the",
            "stand-in writes a step's 4 frames (4 parts, 0.25 s of video) at once, a step every 0.25 s or more:",
            f"a player PART-HOLD-BACK ({first['part_hold_back']:.2f} s) behind the newest part runs dry before"
            " the next step, stalls, and",
            "settles further behind (the target grows a part a stall), so the goal, less than one step, is",
            "missed there: a player of a writer that bursts a step at a time must stay about a step behind, or",
            "stall. *Paced* (`create_app(pace=True)`, off by default), the app publishes each part at its media",
            "time and the goal is met; what stalls remain are hiccups of this shared 2-core machine, which runs",
            f"the generator, the server and chromium together: with parts of {parts_frames:g}"
            f" frame{'s' if parts_frames != 1 else ''}, any hiccup longer than PART-HOLD-BACK is a stall.",
        ]
    lines += ["", f"Whole run: {seconds:.0f} s. ![Broadcast](broadcast.png)"]
    return "\n".join(lines), wall_ratios


def _plot(wall_ratios: dict[int, list[float]], runs: Runs, hls: dict[str, dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3 if hls else 2, figsize=(12 if hls else 8, 3.6))
    ticks = [f"{n:,}" for n in VIEWERS]
    ax = axes[0]
    medians = [statistics.median(wall_ratios[n]) for n in VIEWERS]
    bars = ax.bar(range(len(VIEWERS)), medians, 0.6, color="tab:blue")
    ax.bar_label(bars, labels=[f"{m:.2f}×" for m in medians], fontsize=7)
    for x, n in enumerate(VIEWERS):
        ax.plot([x] * len(wall_ratios[n]), wall_ratios[n], "k.", markersize=3)
    ax.axhline(GOAL_RATIO, color="tab:red", linestyle="--", linewidth=1, label=f"goal at 100: {GOAL_RATIO}×")
    ax.legend(fontsize=7, loc="upper left")
    label_panel(ax, "generator wall / none", "Generator time against viewers", ticks)
    ax = axes[1]
    cpu = [median(runs[str(n)], "cpu_seconds") for n in VIEWERS]
    rss = [median(runs[str(n)], "peak_rss_mib") for n in VIEWERS]
    bars = ax.bar([x - 0.2 for x in range(len(VIEWERS))], cpu, 0.4, color="tab:orange", label="CPU s")
    ax.bar_label(bars, labels=[f"{c:.1f}" for c in cpu], fontsize=7)
    label_panel(ax, "server CPU seconds", "Server CPU and peak RSS", ticks)
    twin = ax.twinx()
    bars = twin.bar([x + 0.2 for x in range(len(VIEWERS))], rss, 0.4, color="tab:green", label="peak MiB")
    twin.bar_label(bars, labels=[f"{r:.0f}" for r in rss], fontsize=7)
    twin.set_ylabel("peak RSS, MiB")
    ax.set_ylim(top=max(cpu) * 1.35)  # room for the legend above the bars
    twin.set_ylim(top=max(rss) * 1.35)
    handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
    twin.legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    if hls:
        ax = axes[2]
        for name, run in hls.items():
            color = "tab:purple" if name.startswith("paced") else "tab:cyan"
            if not run["page"]:
                color = "tab:gray" if name.startswith("paced") else "silver"
            style = "." + ("--" if name.endswith("2") else "-")
            ax.plot(run["positions"], run["latencies"], style, color=color, markersize=3, label=name)
        first = next(iter(hls.values()))
        goal = first["part_hold_back"] + first["part_target"]
        ax.axhline(goal, color="tab:red", linestyle="--", linewidth=1, label="PART-HOLD-BACK + a part")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("player position, s (each timeupdate while live)")
        ax.set_ylabel("seconds behind the newest part")
        ax.set_title(f"hls.js {first['version']} latency, Chromium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.tight_layout()
    path = DOCS / "broadcast.png"
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _hls_summary(run: dict[str, Any]) -> str:
    latencies = run["latencies"]
    return (
        f"median {statistics.median(latencies):.2f} s (min {min(latencies):.2f}, max {max(latencies):.2f},"
        f" {len(latencies)} samples), began at {run['began']:.2f} s, target {statistics.median(run['targets']):.2f} s,"
        f" stalls {run['stalls']}, seeks {run['seeks']}, pace {run['pace']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4, help="rounds of the fan-out (a child process each)")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave the docs alone")
    parser.add_argument(
        "--hls-only",
        action="store_true",
        help="only the hls.js latency runs: print each, leave the docs alone",
    )
    parser.add_argument("--hls-config", type=json.loads, help="hls.js settings (JSON) instead of the page's")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a round's viewer counts, in a fresh process
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)  # and the heap's peaks
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(anyio.run(_round, [int(n) for n in args.child.split(",")], args.traced)))
        return
    if args.hls_only:
        for repeat in range(HLS_REPEATS):
            for name, (step, pace) in HLS_RUNS.items():
                run = _hls_latency(step, pace, args.hls_config)
                if run is None:
                    sys.exit("chromium or hls.js is missing")
                print(
                    f"hls.js {name} {repeat + 1}: {_hls_summary(run)}; latencies"
                    f" {[round(x, 2) for x in run['latencies']]}",
                    flush=True,
                )
        return
    started = time.perf_counter()
    runs, heap = _fan_out(args.repeats)
    joins = {
        "`Broadcast.viewer()`, in process": anyio.run(_live_joins),
        "WebSocket spectator of the app (`/v1/videos/{id}/watch`)": _spectator_joins(),
    }
    for way, these in joins.items():
        print(f"live joins, {way}: {[round(j['ms'], 2) for j in these]} ms", flush=True)
    hls: dict[str, dict[str, Any]] = {}
    for repeat in range(HLS_REPEATS + 1):  # the last: hls.js's own settings, for comparison
        for name, (step, pace) in HLS_RUNS.items():
            page = repeat < HLS_REPEATS
            run = _hls_latency(step, pace, None if page else HLS_DEFAULTS)
            if run is not None:
                key = f"{name}, run {repeat + 1}" if page else f"{name}, hls.js's own settings"
                hls[key] = run
                print(f"hls.js {key}: {_hls_summary(run)}", flush=True)
    section, wall_ratios = _report(runs, heap, joins, hls, args.repeats, time.perf_counter() - started)
    print(section)
    if not args.no_write:
        write_section("broadcast", section)
        print(f"wrote {_plot(wall_ratios, runs, hls)}")


if __name__ == "__main__":
    main()
