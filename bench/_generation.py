"""Shared by bench/generate.py and bench/pipelines.py: a whole Wan-style pipeline to an MP4 file, two ways.

Today (``baseline``): ``pipe(…, output_type="np")`` then ``diffusers.utils.export_to_video``; with streamvae
(``generate``): ``generate_mp4(pipe, …)`` with the same x264 crf and preset. :func:`wan_pipeline` builds a
Wan pipeline of the tests' tiny transformer beside a VAE of the script's choosing; :func:`run_generation` is
the child's measurement of one way (a warm-up call, then the timed call with its denoising told apart by
:class:`StepEnds`), :func:`table` the parent's side-by-side table of those runs.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _harness import X264, Runs, measuring, median, memory_mib, ratios, reset_peak_rss, spread, written
from _report import table_head

from tests.pipelines.wan import WAN21_TRANSFORMER

__all__ = [
    "FPS",
    "METHODS",
    "THREADS",
    "TRANSFORMER",
    "X264",
    "StepEnds",
    "call",
    "growth",
    "run_generation",
    "summary",
    "table",
    "wan_pipeline",
]

FPS = 16
THREADS = 2  # torch threads in every child: this machine's cores
METHODS = {
    "baseline": '`pipe(…, output_type="np")` + `export_to_video` (today)',
    "generate": "`generate_mp4(pipe, …)` (streamvae)",
}
# The tests' tiny Wan 2.1 transformer with diffusers' default rope_max_seq_len: the tests' 32 positions are
# fewer than the 65 latent frames of 257.
TRANSFORMER: dict[str, Any] = {**WAN21_TRANSFORMER, "rope_max_seq_len": 1024}


class StepEnds:
    """A ``callback_on_step_end`` (both ways pass it) that splits a call at the end of its denoising.

    At each step's end it notes the time, the RSS and the peak RSS so far, then resets the peak: after the
    call the process's peak is that of what followed the last step, the decode and the encode.
    """

    def __init__(self) -> None:
        self.denoising_peak_mib = 0.0
        self.rss_at_last_step_mib = float("nan")
        self.last_step_at = float("nan")

    def __call__(
        self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        rss, peak = memory_mib()
        self.denoising_peak_mib = max(self.denoising_peak_mib, peak)
        self.rss_at_last_step_mib, self.last_step_at = rss, time.perf_counter()
        reset_peak_rss()
        return callback_kwargs


def wan_pipeline(vae: Any, **defaults: Any) -> tuple[Any, Callable[..., dict[str, Any]]]:
    """A WanPipeline of ``vae`` and the tiny transformer (``TRANSFORMER``, seeded), without a text encoder,
    and its ``make_kwargs(**overrides)``: seeded prompt embeddings, guidance 6.0, a fresh seeded generator
    every call, and ``defaults``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(0)
    transformer = WanTransformer3DModel(**TRANSFORMER)
    pipe = WanPipeline(
        vae=vae.eval(),
        transformer=transformer.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=None,
        tokenizer=None,
    )
    pipe.set_progress_bar_config(disable=True)

    def make_kwargs(**overrides: Any) -> dict[str, Any]:
        def embeds(seed: int) -> torch.Tensor:
            return torch.randn(1, 16, TRANSFORMER["text_dim"], generator=torch.Generator().manual_seed(seed))

        kwargs = {
            "prompt_embeds": embeds(1),
            "negative_prompt_embeds": embeds(2),
            "guidance_scale": 6.0,
            "generator": torch.Generator().manual_seed(0),
            **defaults,
        }
        return {**kwargs, **overrides}

    return pipe, make_kwargs


def call(method: str, pipe: Any, kwargs: dict[str, Any], path: Path) -> float:
    """One way to an MP4 file at ``path``; the baseline's seconds in ``export_to_video`` (else 0)."""
    if method == "baseline":
        from diffusers.utils import export_to_video

        frames = pipe(**kwargs, output_type="np").frames[0]  # the whole video, float32 [0, 1]
        exporting = time.perf_counter()
        export_to_video(frames, str(path), fps=FPS)
        return time.perf_counter() - exporting
    import anyio

    from streamvae.pipelines import generate_mp4

    async def generate() -> list[bytes]:
        return await generate_mp4(pipe, fps=FPS, session_options={"video_codec_options": X264}, **kwargs)

    (video,) = anyio.run(generate)
    path.write_bytes(video)
    return 0.0


def run_generation(
    method: str, config: str, pipe: Any, make_kwargs: Any, warm_up_frames: int, **overrides: Any
) -> dict[str, Any]:
    """One way's record: a warm-up call of ``warm_up_frames``, then the timed call of ``make_kwargs(**overrides)``."""
    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory() as tmp:
        warm_up = make_kwargs(**{**overrides, "num_frames": warm_up_frames}, callback_on_step_end=StepEnds())
        call(method, pipe, warm_up, Path(tmp) / "warm-up.mp4")
        path = Path(tmp) / "out.mp4"
        steps = StepEnds()
        kwargs = make_kwargs(**overrides, callback_on_step_end=steps)
        with measuring() as cost:
            export_seconds = call(method, pipe, kwargs, path)
        return {
            "method": method,
            "config": config,
            **cost.record(),
            "denoising_seconds": steps.last_step_at - cost.started,
            "export_seconds": export_seconds,
            "denoising_peak_mib": steps.denoising_peak_mib,
            "rss_at_last_step_mib": steps.rss_at_last_step_mib,
            "after_peak_mib": cost.peak_rss_mib,  # since the last step's end
            "peak_rss_mib": max(steps.denoising_peak_mib, cost.peak_rss_mib),
            **written(path),
            "expected_frames": kwargs["num_frames"],
        }


def growth(run: dict[str, Any]) -> float:
    """MiB the process grew by after the denoising (the decode and the encode): its peak since the last
    step's end over its RSS then."""
    return float(run["after_peak_mib"] - run["rss_at_last_step_mib"])


def summary(run: dict[str, Any]) -> str:
    """One run's line as it ends."""
    return f"{run['wall']:.2f} s, peak RSS {run['peak_rss_mib']:.0f} MiB (+{growth(run):.0f}), {run['frames']} frames"


COLUMNS = (
    "way | wall, median (min–max) | process CPU | peak RSS of the call, median (min–max) | "
    "growth after the denoising, median (min–max) | ffmpeg subprocess, peak RSS | MP4"
)


def table(runs: Runs) -> str:
    rows = table_head(COLUMNS)
    for method, label in METHODS.items():
        mine = runs[method]
        d = 2 if median(mine, "wall") < 10 else 1
        wall = (
            f"{median(mine, 'wall'):.{d}f} s ({spread([r['wall'] for r in mine], 's', d)}); "
            f"denoising {median(mine, 'denoising_seconds'):.{d}f} s"
        )
        if method == "baseline":
            wall += f", export_to_video {median(mine, 'export_seconds'):.{d}f} s"
        peaks, grown = [r["peak_rss_mib"] for r in mine], [growth(r) for r in mine]
        ffmpeg = median(mine, "subprocess_peak_mib")
        rows.append(
            f"| {label} | {wall} | {median(mine, 'cpu_seconds'):.{d}f} s | "
            f"{statistics.median(peaks):.0f} MiB ({spread(peaks, 'MiB', 0)}) | "
            f"+{statistics.median(grown):.0f} MiB ({spread(grown, 'MiB', 0)}) | "
            f"{f'{ffmpeg:.0f} MiB' if ffmpeg else '—'} | "
            f"{mine[0]['frames']} frames, {median(mine, 'bytes') / 1024:.0f} KiB |"
        )
    pairs = list(zip(runs["baseline"], runs["generate"], strict=True))
    rows += [
        "",
        f"- wall, streamvae ÷ today, per repeat: {ratios([new['wall'] / old['wall'] for old, new in pairs])}",
        "- peak RSS, streamvae ÷ today, per repeat (the Python process, ffmpeg's excluded): "
        f"{ratios([new['peak_rss_mib'] / old['peak_rss_mib'] for old, new in pairs])}",
    ]
    if min(growth(run) for old_new in pairs for run in old_new) >= 10:  # a ratio of a few MiB is noise
        rows.append(
            "- growth after the denoising, streamvae ÷ today, per repeat: "
            f"{ratios([growth(new) / growth(old) for old, new in pairs])}"
        )
    if not all(run["peak_reset"] for run in (*runs["baseline"], *runs["generate"])):
        rows.append("- (peak RSS could not be reset here: it includes building the pipeline and the warm-up)")
    return "\n".join(rows)
