"""Control-to-photon latency of ``WS /v1/realtime/video`` against the generator's own step time.

A real WebSocket client (``websockets``) steers the seeded stand-in served by uvicorn: after the first
piece it sends a prompt every few steps, and notes when the binary frame that first shows it arrives (the
one after the ``video.chunk_metadata`` that lists the event in ``started_event_ids``). The stand-in waits
``step_seconds`` between the pieces it generates, so a step is that wait plus one piece's decode and
encode; the client measures it too, as the time between the first pieces of consecutive steps.

The reading is the ratio of the two medians. An interaction is taken at the start of the next step, and
its first frame goes out once the frame after it closes its fragment, so about one step and a little is
the expected figure. The server's own figure (``session.done``'s ``control_to_photon_seconds``, from
reading the interaction to sending that frame) is reported beside the client's.

    .venv/bin/python bench/interactions.py                     # writes the "interactions" section
                                                                 # of docs/benchmarks.md and
                                                                 # docs/interactions.png
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))  # tests/_server.py
from _report import DOCS, write_section

from streamvae.server import create_app
from tests._server import running_server

STEP_SECONDS = (0.1, 0.25, 0.5, 1.0)
#: steps between two interactions of one session
EVERY = 3


@dataclass
class Session:
    """What one steered session measured, in seconds."""

    step_seconds: float
    client: list[float] = field(default_factory=list)  # send → the binary frame that shows it
    server: list[float] = field(default_factory=list)  # the server's own figure
    steps: list[float] = field(default_factory=list)  # the first pieces of consecutive steps, apart


async def steer(url: str, step_seconds: float, frames: int, size: int) -> Session:
    from websockets.asyncio.client import connect

    result = Session(step_seconds)
    sent: dict[str, float] = {}
    step_first: dict[int, float] = {}
    start = {
        "type": "session.start",
        "num_frames": frames,
        "width": size,
        "height": size,
        "step_seconds": step_seconds,
    }
    async with connect(url, max_size=None) as websocket:
        await websocket.send(json.dumps(start))
        number, showing = 0, None
        last_step = -1
        async for message in websocket:
            now = time.perf_counter()
            if isinstance(message, bytes):
                for event_id in showing or ():
                    result.client.append(now - sent.pop(event_id))
                showing = None
                continue
            reply = json.loads(message)
            if reply["type"] == "video.chunk_metadata":
                showing = [i for i in reply["started_event_ids"] if i in sent]
                step = reply["generation_chunk_index"]
                if step != last_step and reply["num_frames"]:
                    step_first[step] = now
                    if step % EVERY == 1:  # steer: a prompt while later steps are still to come
                        number += 1
                        event_id = f"e{number}"
                        sent[event_id] = time.perf_counter()
                        interaction = {"event_id": event_id, "event": {"prompt": f"prompt {number}"}}
                        await websocket.send(
                            json.dumps({"type": "session.interaction", "interaction": interaction})
                        )
                    last_step = step
            elif reply["type"] == "session.done":
                result.server = list(reply["statistics"]["control_to_photon_seconds"])
                break
            elif reply["type"] == "error":
                raise RuntimeError(f"the server said: {reply}")
    ordered = [step_first[s] for s in sorted(step_first)]
    result.steps = [b - a for a, b in itertools.pairwise(ordered[1:])]  # past the first step (the build)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=65)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    runs: dict[float, list[Session]] = {s: [] for s in STEP_SECONDS}
    with running_server(create_app()) as base:
        url = base.replace("http", "ws") + "/v1/realtime/video"
        for _ in range(args.repeats):
            for step_seconds in STEP_SECONDS:
                runs[step_seconds].append(asyncio.run(steer(url, step_seconds, args.frames, args.size)))
                print(f"step {step_seconds} s: {runs[step_seconds][-1]}", flush=True)
    rows = []
    for step_seconds, sessions in runs.items():
        client = [v for s in sessions for v in s.client]
        server = [v for s in sessions for v in s.server]
        steps = [v for s in sessions for v in s.steps]
        step, photon = statistics.median(steps), statistics.median(client)
        rows.append((step_seconds, step, photon, statistics.median(server), max(client), len(client)))
    lines = [
        "## interactions",
        "",
        "Control-to-photon latency of `WS /v1/realtime/video` (a real `websockets` client steering the",
        f"stand-in under uvicorn, {args.frames} frames of {args.size}², a prompt every {EVERY} steps,",
        f"{args.repeats} sessions a step time). `.venv/bin/python bench/interactions.py`.",
        "",
        "| stand-in wait | step (measured) | control to photon, client | server's figure | longest | ratio to a step | interactions |",
        "|---|---|---|---|---|---|---|",
    ]
    for wait, step, photon, server, longest, count in rows:
        lines.append(
            f"| {wait:g} s | {step:.3f} s | {photon:.3f} s | {server:.3f} s | {longest:.3f} s | "
            f"{photon / step:.2f}× | {count} |"
        )
    ratios = [photon / step for _, step, photon, *_ in rows]
    lines += [
        "",
        f"Reading: an interaction shows {min(ratios):.2f}–{max(ratios):.2f} steps after it is sent (medians).",
        "The generator takes what has come when it starts a piece. Where its wait is most of a step, it is",
        "waiting when the interaction comes, and the next piece shows it: about one step. Where the decode",
        "is most of a step, the generator has made the next piece already while the current one decoded",
        "(the overlap that keeps the pipeline busy), and the piece after it shows the change: about two.",
        "The server's figure (from reading the message to sending the frame) is within milliseconds of",
        "the client's: the wait is the generation's, not the transport's.",
        "",
        "![control to photon](interactions.png)",
    ]
    print(write_section("interactions", "\n".join(lines)))
    plot(rows, DOCS / "interactions.png")


def plot(rows: list[tuple[Any, ...]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    steps = [row[1] for row in rows]
    axes.plot(steps, [row[2] for row in rows], "o-", label="control to photon (client, median)")
    axes.plot(steps, [row[3] for row in rows], "s--", label="server's figure (median)")
    axes.plot(steps, steps, ":", color="grey", label="one step")
    axes.plot(steps, [2 * s for s in steps], ":", color="lightgrey", label="two steps")
    axes.set_xlabel("generator step (s)")
    axes.set_ylabel("seconds")
    axes.set_title("interaction → first frame that shows it")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
