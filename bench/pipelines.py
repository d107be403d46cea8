"""Pipelines at realistic video sizes: ``generate_mp4`` vs ``pipe()`` + ``export_to_video``, and Helios's first byte.

Two measurements, side by side in one run, each run a fresh child process (its peak RSS its own):

1. **Wan at realistic frame sizes.** ``WanPipeline`` with the tiny Wan transformer of ``bench/_generation.py``
   (``TRANSFORMER``, ``rope_max_seq_len`` 1024) and a small-channel ``AutoencoderKLWan`` (``tests/_vaes.py``'s
   ``tiny_wan21``: ``base_dim`` 3, ``dim_mult`` [1, 1, 1, 1], ``num_res_blocks`` 1, weights re-drawn so the
   video has content), so that the video's size, not the model, sets the memory: 257 frames at 240×416
   and 33 frames at 480×832. Today: ``pipe(…, output_type="np")`` then ``export_to_video``; with
   streamvae: ``generate_mp4(pipe, fps=16, …)``, the same x264 crf and preset (``bench/_harness.py``'s
   ``X264``). Wall time and peak RSS of the call, as ``bench/generate.py`` measures them
   (``bench/_generation.py``'s ``run_generation``).
2. **Helios's first byte.** ``HeliosPipeline`` (``tests/pipelines/helios.py``'s ``helios`` builder) at
   128×128 and 132 frames, 4 autoregressive chunks each decoded inside the chunk loop: the time from the
   call's start to the first byte of ``stream_generation`` against ``pipe(…, output_type="np")``'s total
   time, and ``stream_generation``'s total time.

    pip install -e '.[bench]'          # imageio + imageio-ffmpeg (export_to_video), matplotlib, psutil
    python bench/pipelines.py          # writes the "pipelines" section of docs/benchmarks.md,
                                       # docs/pipelines_bench.json (every run) and docs/pipelines_bench.png
    python bench/pipelines.py --quick  # small sizes, one repeat: prints, writes nothing
    python bench/pipelines.py --from-runs docs/pipelines_bench.json   # report saved runs again

On this 2-core CPU the Wan decode costs about a second a 240×416 frame whatever the channel count (small
channels take PyTorch's slow im2col conv3d), so one run at 257 frames takes four to five minutes:
the Wan sizes run one repeat by default (``--repeats``), Helios two (``--helios-repeats``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))  # tests/pipelines/helios.py, tests/_vaes.py
from _generation import FPS, METHODS, THREADS, X264, growth, run_generation, table, wan_pipeline
from _harness import Runs, measuring, median, ratios, side_by_side, spawn_child, spread, written
from _report import DOCS, label_panel, stacked_bars, write_section

JSON_PATH = DOCS / "pipelines_bench.json"
PLOT_PATH = DOCS / "pipelines_bench.png"
HELIOS_METHODS = {
    "baseline": '`pipe(…, output_type="np")` (today)',
    "stream": "`stream_generation(pipe, …)` (streamvae)",
}


# ---------------------------------------------------------------------------------------------------------
# The configurations
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WanCase:
    """One Wan call: its frame size and length (2 steps, guidance 6.0, as bench/generate.py's LARGE)."""

    height: int
    width: int
    num_frames: int
    warm_up_frames: int = 5  # the warm-up call's length, at the same frame size: both decode paths

    @property
    def name(self) -> str:
        return f"wan {self.num_frames}×{self.height}×{self.width}"

    def video_mib(self) -> float:
        """MiB of one float32 copy of the decoded video."""
        return self.num_frames * self.height * self.width * 3 * 4 / 2**20


@dataclass(frozen=True)
class HeliosCase:
    """One Helios call: its frame size and ``num_frames`` (33-frame windows, one chunk each)."""

    size: int
    num_frames: int
    warm_up_frames: int = 33  # one chunk, at the same frame size

    @property
    def name(self) -> str:
        return f"helios {self.num_frames}×{self.size}×{self.size}"

    @property
    def chunks(self) -> int:
        return -(-self.num_frames // 33)

    @property
    def frames(self) -> int:
        """The frames the call returns: every chunk's 33, cut to ``1 + 4k``."""
        return 1 + 4 * ((33 * self.chunks - 1) // 4)


WAN_CASES = (WanCase(240, 416, 257), WanCase(480, 832, 33))
HELIOS = HeliosCase(128, 132)
QUICK_WAN = (WanCase(64, 64, 17), WanCase(96, 160, 9))
QUICK_HELIOS = HeliosCase(32, 66)


def build_wan() -> tuple[Any, Callable[..., dict[str, Any]]]:
    """A WanPipeline: tests/_vaes.py's tiny_wan21 VAE, bench/_generation.py's tiny transformer; no text encoder."""
    from tests._vaes import tiny_wan21

    return wan_pipeline(tiny_wan21(), num_inference_steps=2)


# ---------------------------------------------------------------------------------------------------------
# One run (a child process)
# ---------------------------------------------------------------------------------------------------------


def run_wan_child(method: str, case: WanCase) -> dict[str, Any]:
    """bench/generate.py's measurement (``run_generation``) of one way at ``case``'s size."""
    pipe, make_kwargs = build_wan()
    size = {"height": case.height, "width": case.width}
    return run_generation(
        method, case.name, pipe, make_kwargs, case.warm_up_frames, **size, num_frames=case.num_frames
    )


class StepTimes:
    """A ``callback_on_step_end`` that notes when each denoising step ended (both ways pass it)."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def __call__(
        self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        self.at.append(time.perf_counter())
        return callback_kwargs


def helios_call(method: str, pipe: Any, kwargs: dict[str, Any], path: Path) -> dict[str, float]:
    """One Helios call to an MP4 file at ``path``; its times in seconds from its start."""
    started = time.perf_counter()
    if method == "baseline":
        from diffusers.utils.export_utils import export_to_video

        frames = pipe(**kwargs, output_type="np").frames[0]
        total = time.perf_counter() - started
        export_to_video(frames, str(path), fps=FPS)
        return {"total": total, "export_seconds": time.perf_counter() - started - total}
    import anyio

    from streamvae.pipelines import stream_generation

    times: dict[str, float] = {}

    async def stream() -> bytes:
        pieces = []
        options = {"video_codec_options": X264}
        async with stream_generation(pipe, fps=FPS, session_options=options, **kwargs) as streams:
            times["entered"] = time.perf_counter() - started
            async for data in streams[0]:
                now = time.perf_counter() - started
                times.setdefault("first_byte", now)
                if b"moof" in data:  # the first media fragment (the bytes before it: ftyp + moov)
                    times.setdefault("first_fragment", now)
                pieces.append(data)
        return b"".join(pieces)

    video = anyio.run(stream)
    times["total"] = time.perf_counter() - started
    path.write_bytes(video)
    return times


def run_helios_child(method: str, case: HeliosCase) -> dict[str, Any]:
    from tests.pipelines.helios import helios

    torch.set_num_threads(THREADS)
    pipe, make_kwargs = helios()
    size = {"height": case.size, "width": case.size}
    with tempfile.TemporaryDirectory() as tmp:
        warm_up = make_kwargs(**size, num_frames=case.warm_up_frames, callback_on_step_end=StepTimes())
        helios_call(method, pipe, warm_up, Path(tmp) / "warm-up.mp4")
        path = Path(tmp) / "out.mp4"
        steps = StepTimes()
        kwargs = make_kwargs(**size, num_frames=case.num_frames, callback_on_step_end=steps)
        with measuring() as cost:
            times = helios_call(method, pipe, kwargs, path)
        return {
            "method": method,
            "config": case.name,
            **times,
            "step_ends": [at - cost.started for at in steps.at],
            "rss_before_mib": cost.rss_before_mib,
            "peak_rss_mib": cost.peak_rss_mib,
            "peak_reset": cost.peak_reset,
            **written(path),
            "expected_frames": case.frames,
        }


# ---------------------------------------------------------------------------------------------------------
# Side by side (the parent)
# ---------------------------------------------------------------------------------------------------------


def spawn(method: str, case: WanCase | HeliosCase) -> dict[str, Any]:
    kind = "wan" if isinstance(case, WanCase) else "helios"
    command = [__file__, "--child", method, "--kind", kind, "--case", json.dumps(asdict(case))]
    return spawn_child(command, f"{method} {case.name}")


def summary(run: dict[str, Any]) -> str:
    first = f", first byte {run['first_byte']:.2f} s" if "first_byte" in run else ""
    wall = run.get("wall", run.get("total"))
    return f"{wall:.2f} s{first}, peak RSS {run['peak_rss_mib']:.0f} MiB, {run['frames']} frames"


def measure(case: WanCase | HeliosCase, repeats: int) -> Runs:
    """``repeats`` runs of each way, alternating (today, streamvae, today, …), each in a fresh process."""
    methods = METHODS if isinstance(case, WanCase) else HELIOS_METHODS
    return side_by_side(case.name, methods, repeats, lambda method: spawn(method, case), summary)


# ---------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------


def pairs(runs: Runs, old: str, new: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return list(zip(runs[old], runs[new], strict=True))


def helios_table(runs: Runs) -> str:
    base, streamed = runs["baseline"], runs["stream"]
    d = 2
    rows = [
        "| way | first byte | total | last denoising step ends | peak RSS (min–max) | MP4 |",
        "|---|---|---|---|---|---|",
        f"| {HELIOS_METHODS['baseline']} | after the call (+ `export_to_video` "
        f"{median(base, 'export_seconds'):.{d}f} s for a file) | {median(base, 'total'):.{d}f} s "
        f"({spread([r['total'] for r in base], 's', d)}) | "
        f"{statistics.median(r['step_ends'][-1] for r in base):.{d}f} s | "
        f"{median(base, 'peak_rss_mib'):.0f} MiB ({spread([r['peak_rss_mib'] for r in base], 'MiB', 0)}) | "
        f"{base[0]['frames']} frames, {median(base, 'bytes') / 1024:.0f} KiB |",
        f"| {HELIOS_METHODS['stream']} | {median(streamed, 'first_byte'):.{d}f} s "
        f"({spread([r['first_byte'] for r in streamed], 's', d)}); first fragment "
        f"{median(streamed, 'first_fragment'):.{d}f} s | {median(streamed, 'total'):.{d}f} s "
        f"({spread([r['total'] for r in streamed], 's', d)}) | "
        f"{statistics.median(r['step_ends'][-1] for r in streamed):.{d}f} s | "
        f"{median(streamed, 'peak_rss_mib'):.0f} MiB ({spread([r['peak_rss_mib'] for r in streamed], 'MiB', 0)}) | "
        f"{streamed[0]['frames']} frames, {median(streamed, 'bytes') / 1024:.0f} KiB (fragmented) |",
        "",
    ]
    both = pairs(runs, "baseline", "stream")
    rows += [
        "- first byte, streamvae ÷ today's total, per repeat: "
        f"{ratios([new['first_byte'] / old['total'] for old, new in both])}",
        "- total, streamvae ÷ today, per repeat: "
        + ratios([new["total"] / old["total"] for old, new in both]),
        "- peak RSS, streamvae ÷ today, per repeat: "
        + ratios([new["peak_rss_mib"] / old["peak_rss_mib"] for old, new in both]),
    ]
    return "\n".join(rows)


def after_denoising(run: dict[str, Any]) -> float:
    """Seconds of the call after its last denoising step's end: the decode and the encode."""
    return float(run["wall"] - run["denoising_seconds"])


def wan_reading(case: WanCase, runs: Runs) -> str:
    both = pairs(runs, "baseline", "generate")
    wall = statistics.median(new["wall"] / old["wall"] for old, new in both)
    after = statistics.median(after_denoising(new) / after_denoising(old) for old, new in both)
    peak = statistics.median(new["peak_rss_mib"] / old["peak_rss_mib"] for old, new in both)
    old_growth = statistics.median(growth(r) for r in runs["baseline"])
    new_growth = statistics.median(growth(r) for r in runs["generate"])
    old_peak, new_peak = median(runs["baseline"], "peak_rss_mib"), median(runs["generate"], "peak_rss_mib")
    old_steps, new_steps = (median(runs[m], "denoising_seconds") for m in ("baseline", "generate"))
    memory = (
        f"streamvae's process peaked at {new_peak:.0f} MiB against today's {old_peak:.0f} MiB "
        f"({peak:.2f}×, {old_peak - new_peak:.0f} MiB less)"
        if new_peak < old_peak
        else f"**streamvae's process peaked higher**: {new_peak:.0f} MiB against today's {old_peak:.0f} MiB "
        f"({peak:.2f}×, {new_peak - old_peak:+.0f} MiB)"
    )
    contended = max(old_steps, new_steps) > 1.5 * min(old_steps, new_steps)
    timing = (
        f"The denoising, the same computation both ways, took {old_steps:.0f} s today and {new_steps:.0f} s "
        "with streamvae: other jobs held the cores during one run, so its wall ratio "
        f"{wall:.2f} says little; after the last step (decode and encode) streamvae took "
        f"{after:.2f}× today's time ({median(runs['generate'], 'wall') - new_steps:.0f} s against "
        f"{median(runs['baseline'], 'wall') - old_steps:.0f} s, {median(runs['baseline'], 'export_seconds'):.0f} s "
        "of it today's `export_to_video`)."
        if contended
        else f"Wall ratio {wall:.2f}, {after:.2f} after the last step (decode and encode: "
        f"{median(runs['generate'], 'wall') - new_steps:.0f} s against "
        f"{median(runs['baseline'], 'wall') - old_steps:.0f} s, {median(runs['baseline'], 'export_seconds'):.0f} s "
        "of it today's `export_to_video`)."
    )
    return (
        f"**{case.name}** (one float32 copy of the video: {case.video_mib():.0f} MiB): after the last "
        f"denoising step today's call grew by {old_growth:.0f} MiB, `generate_mp4`'s by {new_growth:.0f} MiB; "
        f"{memory}. {timing}"
    )


def reading(wan: dict[str, Runs], cases: tuple[WanCase, ...], helios: Runs | None, case: HeliosCase) -> str:
    lines = []
    shown = [c for c in cases if c.name in wan]
    if shown:
        lines.append("\n\n".join(wan_reading(c, wan[c.name]) for c in shown))
        ffmpeg = max(median(wan[c.name]["baseline"], "subprocess_peak_mib") for c in shown)

        def verdict(c: WanCase) -> str:
            runs = wan[c.name]
            old, new = (median(runs[m], "peak_rss_mib") for m in ("baseline", "generate"))
            return (
                f"{c.name.removeprefix('wan ')}: {'lower' if new < old else 'higher'} ({new - old:+.0f} MiB)"
            )

        lines.append(
            "What sets the memory: today's call holds the whole decoded video several times over after the "
            "denoising (the VAE's output built by `torch.cat`, its clamped copy, the float32 numpy frames, "
            "`export_to_video`'s uint8 frames), which grows with frames × height × width; `generate_mp4` holds "
            "a few frames at a time. Both ways also pay the VAE's working memory for one latent frame, which "
            "grows with the frame's area, not the video's length (this small-channel VAE takes PyTorch's slow "
            "conv3d path, which unfolds each layer's input 27-fold), and `generate_mp4`'s process also holds "
            "x264 and its session's threads and buffers (today's x264 is in ffmpeg's own process, up to "
            f"{ffmpeg:.0f} MiB here, outside the ratios). So streamvae's peak against today's: "
            f"{'; '.join(verdict(c) for c in shown)}. Where the video is long the copies it avoids dominate; "
            "where it is short and wide a copy is small next to the decode's working memory, and what "
            "streamvae adds in the process outweighs the copies it avoids. Wall time: on this CPU the decode "
            "keeps both cores busy, so encoding alongside it has little idle time to use; one repeat each way "
            "(the time a 257-frame run takes) on a shared machine."
        )
    if helios:
        both = pairs(helios, "baseline", "stream")
        first = statistics.median(new["first_byte"] / old["total"] for old, new in both)
        total = statistics.median(new["total"] / old["total"] for old, new in both)
        with_export = statistics.median(
            new["total"] / (old["total"] + old["export_seconds"]) for old, new in both
        )
        peak = statistics.median(new["peak_rss_mib"] / old["peak_rss_mib"] for old, new in both)
        extra = median(helios["stream"], "peak_rss_mib") - median(helios["baseline"], "peak_rss_mib")
        last_step = statistics.median(r["step_ends"][-1] for r in helios["stream"])
        steps_per_chunk = len(helios["stream"][0]["step_ends"]) // case.chunks
        first_chunk = statistics.median(r["step_ends"][steps_per_chunk - 1] for r in helios["stream"])
        first_byte = median(helios["stream"], "first_byte")
        before = "before" if first_byte < last_step else "after"
        lines.append(
            f"Helios ({case.chunks} chunks of 33 frames, each decoded inside the chunk loop): "
            f"`stream_generation`'s first byte came {first_byte:.2f} s after the call's start "
            f"({first:.2f}× today's {median(helios['baseline'], 'total'):.2f} s to the end of "
            f'`pipe(output_type="np")`, before any byte of a file, which `export_to_video` then takes '
            f"{median(helios['baseline'], 'export_seconds'):.2f} s more to write), {before} the last denoising "
            f"step's end ({last_step:.2f} s; the first chunk's last step ended at {first_chunk:.2f} s): the "
            "first chunk's first frames leave while that chunk is still being decoded, the rest while the "
            "pipeline denoises the next chunks. Its total, the whole fragmented "
            f"MP4 read, was {total:.2f}× today's `pipe()` alone and {with_export:.2f}× today's `pipe()` + "
            f"`export_to_video`. Its process peaked {extra:+.0f} MiB from today's ({peak:.2f}×): x264 and "
            "the session's threads in the process; the video here is small "
            f"({case.frames}×{case.size}×{case.size}), so today's copies of it cost little."
        )
    return "\n\n".join(lines)


def report(
    wan: dict[str, Runs],
    cases: tuple[WanCase, ...],
    helios: Runs | None,
    helios_case: HeliosCase,
    repeats: int,
    helios_repeats: int,
) -> str:
    import diffusers
    import imageio_ffmpeg

    import streamvae

    wan_tables = "\n\n".join(
        f"**{c.name}** ({1 + (c.num_frames - 1) // 4} latent frames of {c.height // 8}×{c.width // 8})\n\n"
        f"{table(wan[c.name])}"
        for c in cases
        if c.name in wan
    )
    helios_text = f"**{helios_case.name}**\n\n{helios_table(helios)}" if helios else ""
    repeat_text = f"{repeats} repeat{'s' if repeats > 1 else ''}"
    walls = [run["wall"] for runs in wan.values() for way in runs.values() for run in way]
    run_seconds = spread(walls, "s", 0) if walls else "—"
    return f"""
## Pipelines at realistic sizes, and Helios's first byte (`python bench/pipelines.py`)

Today: `frames = pipe(**kwargs, output_type="np").frames[0]`, then `export_to_video(frames, path, fps={FPS})`
(diffusers {diffusers.__version__}, imageio-ffmpeg {imageio_ffmpeg.__version__}: the ffmpeg CLI's libx264 at
crf 25, preset medium). With streamvae {streamvae.__version__}: `generate_mp4(pipe, fps={FPS},
session_options={{"video_codec_options": {json.dumps(X264)}}}, **kwargs)` (the same crf and preset), its
bytes written to a file; for Helios `stream_generation(pipe, …)` with the same options (fragmented MP4,
so x264 also gets `tune` zerolatency), read to the end. Same pipeline, same arguments, a fresh seeded
generator every call; CPU float32, torch {THREADS} threads.

Method: each run is a fresh child process that builds the pipeline, calls it once the same way at the same
frame size but fewer frames (a warm-up: Wan 5 frames, Helios one 33-frame chunk), resets its peak RSS
(`/proc/self/clear_refs`) and runs the timed call; the two ways alternate. Wan is measured as
`bench/generate.py` measures it (its table: *growth after the denoising* is the decode and encode's peak
over the RSS at the last step's end; export_to_video's ffmpeg subprocess is sampled apart). Wan:
{repeat_text} of each way (a Wan run took {run_seconds} here, so the whole bench stays near a quarter of an
hour); Helios: {helios_repeats}. Every MP4 was decoded with PyAV and has the frames
the pipeline returns. Machine: the 2-core CPU development machine, shared and noisy: the ratios,
measured side by side, matter, not the absolute figures.

### Wan at 257×240×416 and 33×480×832: the video's size sets the memory

`WanPipeline`: `tests/_vaes.py`'s `tiny_wan21` VAE (`AutoencoderKLWan(base_dim=3, z_dim=16,
dim_mult=[1, 1, 1, 1], num_res_blocks=1)`, weights re-drawn with a spread so the video has content for
x264; 6 k decoder parameters: the smallest Wan layout, and the fastest one in a side probe on this machine
— about 0.8 s a 240×416 frame, against 1.9 s for `base_dim=8` with the default `dim_mult`, because PyTorch
runs small-channel conv3d through its slow im2col path either way), `bench/generate.py`'s tiny transformer
(2 layers, 2 heads × 12, `rope_max_seq_len` 1024), 2 steps, guidance 6.0.

{wan_tables}

### Helios: the first byte while the pipeline still denoises

`HeliosPipeline` from `tests/pipelines/helios.py`'s `helios` builder (diffusers' tiny Helios transformer,
`tiny_wan21` VAE), {helios_case.size}×{helios_case.size}, `num_frames` {helios_case.num_frames}:
{helios_case.chunks} chunks of 9 latent frames, each denoised (2 steps, guidance 5.0) and then decoded alone
into 33 frames inside the chunk loop; the {33 * helios_case.chunks} decoded frames are cut to
{helios_case.frames}. *First byte*: from the call's start to the first bytes `stream_generation`'s stream
gives (its ftyp + moov; *first fragment*: the first bytes holding a `moof`); *last denoising step ends*:
the last `callback_on_step_end`, from the call's start.

{helios_text}

![Wan wall time and peak RSS, Helios time to first byte](pipelines_bench.png)

{reading(wan, cases, helios, helios_case)}
"""


def plot(wan: dict[str, Runs], cases: tuple[WanCase, ...], helios: Runs | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {"baseline": 'pipe(output_type="np") + export_to_video', "generate": "generate_mp4"}
    colors = {"baseline": "tab:gray", "generate": "tab:blue"}
    fig, (wall_ax, rss_ax, helios_ax) = plt.subplots(1, 3, figsize=(16, 4.6))
    shown = [c for c in cases if c.name in wan]
    width = 0.38
    for offset, method in ((-width / 2, "baseline"), (width / 2, "generate")):
        xs = [i + offset for i in range(len(shown))]
        steps = [median(wan[c.name][method], "denoising_seconds") for c in shown]
        walls = [median(wan[c.name][method], "wall") for c in shown]
        style = {"color": colors[method], "label": names[method]}
        stacked_bars(wall_ax, xs, steps, walls, width, [f"{w:.0f}" for w in walls], **style)
        before = [median(wan[c.name][method], "rss_before_mib") for c in shown]
        peaks = [median(wan[c.name][method], "peak_rss_mib") for c in shown]
        stacked_bars(rss_ax, xs, before, peaks, width, [f"{p:.0f}" for p in peaks], **style)
    labels = [c.name.replace("wan ", "Wan\n") for c in shown]
    label_panel(wall_ax, "wall time of the call (s)", "Wan: wall time (pale: the denoising)", labels)
    rss_title = "Wan: peak RSS during the call (pale: RSS before it)"
    label_panel(rss_ax, "peak RSS of the process (MiB)", rss_title, labels)
    for ax in (wall_ax, rss_ax):
        ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
        ax.legend(fontsize=7, loc="upper right")
    if helios:
        base, streamed = helios["baseline"], helios["stream"]
        rows = [
            ('today: pipe(output_type="np")', median(base, "total"), colors["baseline"]),
            ("today: + export_to_video", median(base, "total") + median(base, "export_seconds"), "silver"),
            ("stream_generation: first byte", median(streamed, "first_byte"), "tab:green"),
            ("stream_generation: total", median(streamed, "total"), colors["generate"]),
        ]
        ys = range(len(rows))
        bars = helios_ax.barh(list(ys), [r[1] for r in rows], color=[r[2] for r in rows])
        helios_ax.bar_label(bars, labels=[f"{r[1]:.2f} s" for r in rows], fontsize=7)
        helios_ax.set_yticks(list(ys), [r[0] for r in rows], fontsize=8)
        helios_ax.invert_yaxis()
        for at in streamed[0]["step_ends"]:
            helios_ax.axvline(at, color="tab:orange", alpha=0.4, lw=0.8)
        helios_ax.set_xlabel("s from the call's start (orange: step ends, a streamed run)")
        helios_ax.set_title(f"Helios {streamed[0]['config'].removeprefix('helios ')}: median")
        helios_ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Pipelines at realistic sizes: today vs streamvae (2-core CPU, a fresh process a run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="Wan runs of each way per size")
    parser.add_argument("--helios-repeats", type=int, default=2, help="Helios runs of each way")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat; print, write nothing")
    parser.add_argument(
        "--skip-wan", action="store_true", help="measure Helios only (prints, writes nothing)"
    )
    parser.add_argument(
        "--from-runs", type=Path, help="report the runs of a saved JSON file, measure nothing"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("wan", "helios"), help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fields = json.loads(args.case)
        if args.kind == "wan":
            print(json.dumps(run_wan_child(args.child, WanCase(**fields))))
        else:
            print(json.dumps(run_helios_child(args.child, HeliosCase(**fields))))
        return

    cases: tuple[WanCase, ...]
    cases, helios_case = (QUICK_WAN, QUICK_HELIOS) if args.quick else (WAN_CASES, HELIOS)
    repeats, helios_repeats = (1, 1) if args.quick else (args.repeats, args.helios_repeats)
    if args.from_runs:
        saved = json.loads(args.from_runs.read_text())
        cases = tuple(WanCase(**c) for c in saved["wan_cases"])
        helios_case = HeliosCase(**saved["helios_case"])
        repeats, helios_repeats = saved["repeats"], saved["helios_repeats"]
        wan, helios = saved["wan"], saved["helios"]
    else:
        started = time.perf_counter()
        wan = {} if args.skip_wan else {c.name: measure(c, repeats) for c in cases}
        helios = measure(helios_case, helios_repeats)
        print(f"measured in {time.perf_counter() - started:.0f} s", flush=True)
    body = report(wan, cases, helios, helios_case, repeats, helios_repeats)
    if args.quick or args.skip_wan:
        print(body)
        return
    if not args.from_runs:
        saved = {
            "repeats": repeats,
            "helios_repeats": helios_repeats,
            "wan_cases": [asdict(c) for c in cases],
            "helios_case": asdict(helios_case),
            "wan": wan,
            "helios": helios,
        }
        JSON_PATH.write_text(json.dumps(saved, indent=1) + "\n")
    plot(wan, cases, helios, PLOT_PATH)
    print(f"wrote {write_section('pipelines', body)}, {JSON_PATH} and {PLOT_PATH}")


if __name__ == "__main__":
    main()
