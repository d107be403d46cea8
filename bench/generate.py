"""Whole pipelines: ``pipe(…, output_type="np")`` + ``export_to_video`` vs ``generate_mp4``, side by side.

Today: ``frames = pipe(**kwargs, output_type="np").frames[0]`` then ``diffusers.utils.export_to_video(frames,
path, fps=16)`` (imageio-ffmpeg). With streamvae: ``generate_mp4(pipe, fps=16, **kwargs)``, which runs the
same pipeline up to its ``vae.decode`` and streams the decode into an MP4, the bytes then written to the
same kind of file. Same pipeline, same arguments, a fresh seeded generator every call.

Configurations: the tiny pipelines of ``tests/pipelines/`` (a tenth of a second a call: what is measured
is each way's overhead), a larger Wan 2.1 pipeline at 257 frames whose VAE decode dominates (``LARGE``), and
that one again with glibc's malloc held to one arena (``ONE_ARENA``, one pair). Each run is a fresh child
process, so its peak RSS is its own; the two ways alternate (today, streamvae, today, streamvae, …) so
that drift on a shared machine hits both alike. In each child the pipeline is built and called once the
same way (a warm-up: lazy imports, first-call allocations), the peak RSS is reset
(``/proc/self/clear_refs``), then the timed call runs, with a ``callback_on_step_end`` that resets it
again at each step's end so the decode and encode's own peak can be told from the denoising's.

    pip install -e '.[bench]'          # imageio + imageio-ffmpeg (export_to_video), matplotlib, psutil
    python bench/generate.py           # writes the "generate" section of docs/benchmarks.md, docs/generate.png
    python bench/generate.py --quick   # one repeat, the large config at 33 frames, prints only
    python bench/generate.py --save-runs runs.json   # … --from-runs runs.json: report them again
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))  # tests/pipelines/
from _generation import FPS, METHODS, THREADS, X264, growth, run_generation, summary, table, wan_pipeline
from _harness import Runs, median, side_by_side, spawn_child, spread
from _report import DOCS, label_panel, stacked_bars, write_section

TINY = ("wan21", "hunyuan_video", "ltx_timestep", "cogvideox")
WARM_UP_FRAMES = 9


# ---------------------------------------------------------------------------------------------------------
# The larger Wan pipeline
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Large:
    """A WanPipeline whose VAE decode dominates: a reduced AutoencoderKLWan, a tiny transformer."""

    base_dim: int  # AutoencoderKLWan base_dim (126.9 M-parameter Wan 2.1: 96)
    num_res_blocks: int  # AutoencoderKLWan num_res_blocks (Wan 2.1: 2)
    height: int
    width: int
    num_frames: int
    steps: int  # denoising steps (guidance 6.0: two transformer passes a step)

    def describe(self) -> str:
        return (
            f"`WanPipeline`, `AutoencoderKLWan(base_dim={self.base_dim}, z_dim=16, "
            f"num_res_blocks={self.num_res_blocks})` (default `dim_mult` [1, 2, 4, 4], diffusers' default "
            f"initialisation, seeded), the tiny Wan transformer of `tests/pipelines/wan.py` (2 layers, 2 heads "
            f"× 12) with `rope_max_seq_len` 1024 for {1 + (self.num_frames - 1) // 4} latent frames; "
            f"{self.num_frames} frames at {self.height}×{self.width}, {self.steps} steps, guidance 6.0"
        )


# On this 2-core CPU the Wan 2.1 decode costs about 1.2 s a frame at 256×256 with base_dim 32 (over five
# minutes for 257 frames), so the larger config keeps base_dim 32 and shrinks the frame instead.
LARGE = Large(base_dim=32, num_res_blocks=1, height=128, width=128, num_frames=257, steps=2)


def build_large(large: Large) -> tuple[Any, Callable[..., dict[str, Any]]]:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=large.base_dim, z_dim=16, num_res_blocks=large.num_res_blocks)
    size = {"height": large.height, "width": large.width, "num_frames": large.num_frames}
    return wan_pipeline(vae, **size, num_inference_steps=large.steps)


# ---------------------------------------------------------------------------------------------------------
# One run (a child process)
# ---------------------------------------------------------------------------------------------------------


def run_child(method: str, config: str, num_frames: int | None) -> dict[str, Any]:
    if config == "large":
        pipe, make_kwargs = build_large(LARGE)
    else:
        from tests.pipelines import BUILDERS

        pipe, make_kwargs = BUILDERS[config]()
    overrides = {} if num_frames is None else {"num_frames": num_frames}
    return run_generation(method, config, pipe, make_kwargs, WARM_UP_FRAMES, **overrides)


# ---------------------------------------------------------------------------------------------------------
# Side by side (the parent)
# ---------------------------------------------------------------------------------------------------------

#: the larger config again with glibc's malloc held to one arena (``MALLOC_ARENA_MAX=1``): how much of a
#: peak is memory freed in one thread's arena that another thread cannot reuse
ONE_ARENA = "large-one-arena"


def spawn(method: str, config: str, num_frames: int | None, env: dict[str, str]) -> dict[str, Any]:
    command = [__file__, "--child", method, "--config", config]
    if num_frames is not None:
        command += ["--num-frames", str(num_frames)]
    return spawn_child(command, f"{method} {config}", {**os.environ, **env})


def measure(case: str, repeats: int, large: Large) -> Runs:
    """``repeats`` runs of each way, alternating, each in a fresh process."""
    config = "large" if case in ("large", ONE_ARENA) else case
    env = {"MALLOC_ARENA_MAX": "1"} if case == ONE_ARENA else {}
    frames = large.num_frames if config == "large" else None
    return side_by_side(case, METHODS, repeats, lambda method: spawn(method, config, frames, env), summary)


# ---------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------

PLOT_NAMES = {"baseline": 'pipe(output_type="np") + export_to_video', "generate": "generate_mp4"}
PLOT_COLORS = {"baseline": "tab:gray", "generate": "tab:blue"}


def plot(results: dict[str, Runs], large: Large, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(results)
    big = f"\n{large.num_frames} frames"
    labels = [
        {"large": f"large{big}", ONE_ARENA: f"large{big},\nMALLOC_ARENA_MAX=1"}.get(case, case)
        for case in cases
    ]
    fig, (wall_ax, rss_ax) = plt.subplots(1, 2, figsize=(13, 4.4))
    width = 0.38
    for offset, method in ((-width / 2, "baseline"), (width / 2, "generate")):
        xs = [i + offset for i in range(len(cases))]
        walls = [[run["wall"] for run in results[case][method]] for case in cases]
        middle = [statistics.median(w) for w in walls]
        errors = [
            [m - min(w) for m, w in zip(middle, walls, strict=True)],
            [max(w) - m for m, w in zip(middle, walls, strict=True)],
        ]
        style = {"color": PLOT_COLORS[method], "label": PLOT_NAMES[method]}
        bars = wall_ax.bar(xs, middle, width, yerr=errors, capsize=3, **style)
        wall_ax.bar_label(bars, labels=[f"{m:.2f}" if m < 10 else f"{m:.1f}" for m in middle], fontsize=7)
        before = [median(results[case][method], "rss_before_mib") for case in cases]
        peaks = [median(results[case][method], "peak_rss_mib") for case in cases]
        stacked_bars(rss_ax, xs, before, peaks, width, [f"{p:.0f}" for p in peaks], **style)
    wall_ax.set_yscale("log")
    label_panel(wall_ax, "wall time of the call (s, log scale)", "wall time: median, min–max", labels)
    rss_title = "peak RSS during the call: median (pale: RSS just before it)"
    label_panel(rss_ax, "peak RSS of the process (MiB)", rss_title, labels)
    for ax in (wall_ax, rss_ax):
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("A diffusers pipeline to an MP4: today vs generate_mp4 (2-core CPU, a fresh process a run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pair_median(runs: Runs, value: Callable[[dict[str, Any]], float]) -> float:
    """The median over repeats of ``value(streamvae's run) ÷ value(today's run)``."""
    return statistics.median(
        value(new) / value(old) for old, new in zip(runs["baseline"], runs["generate"], strict=True)
    )


def reading(results: dict[str, Runs], large: Large) -> str:
    """The interpretation, its figures (and the direction of each comparison) taken from this run."""

    def grown(runs: Runs, method: str) -> float:
        return statistics.median(growth(run) for run in runs[method])

    def grown_text(runs: Runs, method: str) -> str:
        values = [growth(run) for run in runs[method]]
        spread_text = f" ({spread(values, 'MiB', 0)})" if len(values) > 1 else ""
        return f"{statistics.median(values):.0f} MiB{spread_text}"

    def wall_ratio(runs: Runs) -> float:
        return pair_median(runs, lambda run: run["wall"])

    tiny = [case for case in results if case not in ("large", ONE_ARENA)]
    lines = []
    if tiny:
        walls = ", ".join(f"{case} {wall_ratio(results[case]):.2f}" for case in tiny)

        def across(method: str, value: Callable[[dict[str, Any]], float]) -> float:
            """The median over the tiny cases of each case's median."""
            return statistics.median(
                statistics.median(value(run) for run in results[case][method]) for case in tiny
            )

        def after_steps(run: dict[str, Any]) -> float:
            return float(run["wall"] - run["denoising_seconds"])

        extra = across("generate", lambda r: r["peak_rss_mib"]) - across(
            "baseline", lambda r: r["peak_rss_mib"]
        )
        lines.append(
            f"Tiny pipelines (wall ratios {walls}): a whole call is about a tenth of a second or less, the "
            f"denoising {across('baseline', lambda r: r['denoising_seconds']):.3f} s of it, and what differs "
            "is each way's fixed cost. After the last step, today's "
            f"call takes {across('baseline', after_steps):.3f} s, {across('baseline', lambda r: r['export_seconds']):.3f} s "
            "of it in `export_to_video` (for 9 tiny frames, mostly starting the ffmpeg process and "
            f"piping to it); `generate_mp4` takes {across('generate', after_steps):.3f} s (an event loop, a "
            "worker thread, an encoder session in the process). Peak RSS is the imports and the pipeline; "
            f"a call adds a few MiB to it, and streamvae's process peaks {extra:+.0f} MiB from today's (its "
            "modules and its session's threads), while today's call also runs an ffmpeg process of "
            f"{across('baseline', lambda r: r['subprocess_peak_mib']):.0f} MiB."
        )
    if "large" in results:
        runs = results["large"]
        video_mib = large.num_frames * large.height * large.width * 3 * 4 / 2**20
        ratio = wall_ratio(runs)
        verdict = (
            "no measurable difference: on a CPU the decode keeps both cores busy, so encoding alongside it "
            "has no idle core to fill"
            if 0.9 <= ratio <= 1.1
            else "outside ±10%, but repeats on this shared machine differ by as much (see min–max)"
        )
        lines.append(
            f"Larger Wan at {large.num_frames} frames: the VAE decode is nearly all of the call (denoising "
            f"{median(runs['baseline'], 'denoising_seconds'):.1f} s, today's export "
            f"{median(runs['baseline'], 'export_seconds'):.1f} s of {median(runs['baseline'], 'wall'):.1f} s). "
            f"Wall ratio {ratio:.2f}, {verdict}; with a GPU decode the host's cores are free while it works "
            "(the pipeline section). Memory after the denoising: today's call holds the whole decoded video "
            f"({large.num_frames}×{large.height}×{large.width}×3 float32 = {video_mib:.0f} MiB) several times "
            "over — the VAE's output (built by `torch.cat`, a latent frame at a time), its clamped copy, the "
            "pipeline's float32 numpy frames, export_to_video's uint8 frames — and grew by "
            f"{grown_text(runs, 'baseline')}; `generate_mp4` holds a few 4-frame chunks at a time and grew by "
            f"{grown_text(runs, 'generate')}."
        )
        if ONE_ARENA in results:
            one = results[ONE_ARENA]
            before = grown(runs, "generate") - grown(runs, "baseline")
            after = grown(one, "generate") - grown(one, "baseline")
            lines.append(
                "`generate_mp4`'s decode, encode and x264 run in threads of their own, and glibc gives threads "
                "arenas of their own, whose freed memory the others do not reuse. With one arena "
                f"(`MALLOC_ARENA_MAX=1`, one pair): today {grown_text(one, 'baseline')}, `generate_mp4` "
                f"{grown_text(one, 'generate')}; streamvae's growth minus today's went from {before:+.0f} to "
                f"{after:+.0f} MiB. Neither the arenas nor the chunks grow with the video (the pipeline "
                "section: streamed peak RSS flat from 257 to 1025 frames); today's copies do, with length × "
                "resolution: at 257×480×832 one float32 copy is 1.2 GiB. At the small frame this CPU decodes "
                "in half a minute the video is too small next to those fixed costs for that to show: with "
                "glibc's default arenas streamvae's peak RSS here is "
                f"{pair_median(runs, lambda run: run['peak_rss_mib']):.2f}× today's."
            )
    return "\n\n".join(lines)


def report(results: dict[str, Runs], repeats: int, large: Large) -> str:
    import diffusers
    import imageio_ffmpeg

    import streamvae

    tiny = "\n\n".join(
        f"**{case}** (`tests/pipelines/`: {results[case]['baseline'][0]['frames']} frames, 2 steps)\n\n"
        f"{table(results[case])}"
        for case in results
        if case not in ("large", ONE_ARENA)
    )
    larger = ""
    if "large" in results:
        larger += f"{table(results['large'])}\n"
    if ONE_ARENA in results:
        pairs = len(results[ONE_ARENA]["baseline"])
        larger += f"\nThe same with `MALLOC_ARENA_MAX=1` in both children ({pairs} pair(s)):\n\n{table(results[ONE_ARENA])}\n"
    return f"""
## Whole pipelines: `pipe(…, output_type="np")` + `export_to_video` vs `generate_mp4` (`python bench/generate.py`)

Today: `frames = pipe(**kwargs, output_type="np").frames[0]`, then `export_to_video(frames, path, fps={FPS})`
(diffusers {diffusers.__version__}, imageio-ffmpeg {imageio_ffmpeg.__version__}: the ffmpeg CLI's libx264
at crf 25, preset medium, yuv420p, threads auto — 3 frame threads on 2 cores —, swscale's BT.601
conversion). With streamvae {streamvae.__version__}: `generate_mp4(pipe, fps={FPS},
session_options={{"video_codec_options": {json.dumps(X264)}}}, **kwargs)`, its bytes written to a file: libx264 through
PyAV at the same crf and preset, threads streamvae's default min(4, cores) = 2, BT.709 conversion. Same
pipeline, same arguments, a fresh seeded generator every call; CPU float32, torch {THREADS} threads.

Method: {repeats} repeats, the two ways alternating (today, streamvae, today, …), each run a fresh child
process that builds the pipeline, calls it once the same way at {WARM_UP_FRAMES} frames (a warm-up), resets
its peak RSS (`/proc/self/clear_refs`) and runs the timed call. *Peak RSS* is that process's peak during
the call; a `callback_on_step_end` (passed on both sides) notes the RSS at the end of each denoising step
and resets the peak there, so *growth after the denoising* is the decode and the encode's: their peak
over the RSS at the last step's end. export_to_video's ffmpeg subprocess has its own RSS (sampled every
5 ms, not in the ratios). Every MP4 was decoded with PyAV and has the frames asked for.
Machine: the 2-core CPU development machine, shared and noisy (other jobs ran at the same time): the
ratios, measured side by side, matter, not the absolute figures.

### Tiny pipelines: what each way adds to a call

{tiny}

### A larger Wan 2.1 pipeline at {large.num_frames} frames: the VAE decode dominates

{large.describe()}. A CPU decodes a 256×256 frame of this VAE in about a second, so the frame is
{large.height}×{large.width} to keep a run near half a minute.

{larger}
![wall time and peak RSS per configuration](generate.png)

{reading(results, large)}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way per configuration")
    parser.add_argument(
        "--quick", action="store_true", help="one repeat, the large config at 33 frames; print, write nothing"
    )
    parser.add_argument(
        "--cases",
        default=",".join((*TINY, "large", ONE_ARENA)),
        help=f"comma-separated: tests/pipelines/ builders, 'large', '{ONE_ARENA}' (one repeat)",
    )
    parser.add_argument("--save-runs", type=Path, help="also write every run's figures to this JSON file")
    parser.add_argument(
        "--from-runs", type=Path, help="report the runs of a --save-runs file, measure nothing"
    )
    parser.add_argument("--child", choices=list(METHODS), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--num-frames", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args.config, args.num_frames)))
        return

    repeats = 1 if args.quick else args.repeats
    large = dataclasses.replace(LARGE, num_frames=33) if args.quick else LARGE
    if args.from_runs:
        saved = json.loads(args.from_runs.read_text())
        repeats, large, results = saved["repeats"], Large(**saved["large"]), saved["results"]
    else:
        started = time.perf_counter()
        results = {
            case: measure(case, 1 if case == ONE_ARENA else repeats, large) for case in args.cases.split(",")
        }
        print(f"measured in {time.perf_counter() - started:.0f} s", flush=True)
    if args.save_runs:
        saved = {"repeats": repeats, "large": dataclasses.asdict(large), "results": results}
        args.save_runs.write_text(json.dumps(saved, indent=1))
    body = report(results, repeats, large)
    if args.quick:
        print(body)
        return
    plot(results, large, DOCS / "generate.png")
    print(f"wrote {write_section('generate', body)} and {DOCS / 'generate.png'}")


if __name__ == "__main__":
    main()
