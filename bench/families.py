"""Every VAE family: ``vae.decode`` + the pipeline's post-processing + ``export_to_video`` vs ``decode_to_mp4``.

Today, for each family: ``video = vae.decode(z).sample``, the post-processing of the family's pipeline
(``VideoProcessor.postprocess_video(video, output_type="np")``; MiniMax-H3 first maps its ImageNet-normalized
pixels with ``(video.float() * pixel_std + pixel_mean).clamp(0, 1)``; Allegro permutes its ``[B, T, C, H, W]``
output; SVD decodes its flattened frames), then ``diffusers.utils.export_to_video(frames, path, fps=16)``
(imageio-ffmpeg). With streamvae: ``decode_to_mp4(vae, z, fps=16, output_files=[path])``, the same crf and
preset. Same VAE, same latent.

Each family's VAE is its tiny seeded test VAE (``tests/_vaes.py``: few channels, one layer) at a realistic
frame size, 480×832 (the family's default where that does not fit its compression), so that the frame size,
not the model, sets the memory; 17–33 frames. Each run is a fresh child process, so its peak RSS is its
own; the two ways alternate so that drift on a shared machine hits both alike. In each child the VAE decodes
a small latent once (a warm-up), the peak RSS is reset (``/proc/self/clear_refs``), then the timed call runs.

    pip install -e '.[bench]'            # imageio + imageio-ffmpeg (export_to_video), matplotlib, psutil
    python bench/families.py             # writes the "families" section of docs/benchmarks.md, docs/families.png
    python bench/families.py --quick     # one repeat at 256×256: print only
    python bench/families.py --families wan21,minimax_h3   # re-measure these; the others' runs are kept

Every family's runs are kept in docs/families.json, so a run of some families reports them beside the runs
of the others measured before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))  # tests/_vaes.py
from _harness import X264, Runs, measuring, median, side_by_side, spawn_child, written
from _report import DOCS, write_section

FPS = 16
THREADS = 2  # torch threads in every child: this machine's cores
METHODS = {
    "baseline": "`vae.decode` + post-processing + `export_to_video` (today)",
    "streamvae": "`decode_to_mp4(vae, z)` (streamvae)",
}


@dataclass(frozen=True)
class Family:
    """One family's benchmark case: its tiny test VAE at a realistic frame size."""

    label: str  # what the table calls it
    factory: str  # the tests/_vaes.py function that builds the VAE
    latent_frames: int
    height: int = 480  # pixel frame size
    width: int = 832
    factory_kwargs: tuple[tuple[str, Any], ...] = ()  # what the factory takes beyond its defaults
    warm_up_size: int = 64  # pixel size of the warm-up decode (at least one tile for Allegro)


FAMILIES: dict[str, Family] = {
    "wan21": Family("Wan 2.1", "tiny_wan21", 5),
    "wan22": Family("Wan 2.2", "tiny_wan22", 5),
    "hunyuan_video": Family("HunyuanVideo", "tiny_hunyuan_video", 5),
    "ltx_video": Family("LTX-Video", "tiny_ltx_video", 3),
    "cogvideox": Family("CogVideoX", "tiny_cogvideox", 5),
    "minimax_h3": Family("MiniMax-H3", "tiny_minimax_h3", 7),
    "hunyuan_video15": Family("HunyuanVideo 1.5", "tiny_hunyuan_video15", 5),
    "mochi": Family("Mochi", "tiny_mochi", 4),
    # diffusers' own tiles (24 frames of 320×320 pixels), not the tests' small ones
    "allegro": Family("Allegro", "tiny_allegro", 6, factory_kwargs=(("frames", None),), warm_up_size=320),
    "cosmos": Family("Cosmos", "tiny_cosmos", 3),
    "magvit": Family("EasyAnimate (Magvit)", "tiny_magvit", 5),
    "stable_video": Family("Stable Video Diffusion", "tiny_stable_video", 17),
    "kvae": Family("KVAE", "tiny_kvae", 5),
}


# ---------------------------------------------------------------------------------------------------------
# One run (a child process)
# ---------------------------------------------------------------------------------------------------------


def build(family: Family, height: int, width: int) -> tuple[Any, torch.Tensor]:
    """The family's VAE and a seeded latent that decodes to ``height`` × ``width`` frames."""
    import tests._vaes as vaes
    from streamvae.models import chunked_decoder

    vae = getattr(vaes, family.factory)(**dict(family.factory_kwargs))
    ratio = spatial_ratio(vae)
    channels = chunked_decoder(vae).latent_channels
    assert channels is not None
    generator = torch.Generator().manual_seed(0)
    shape = (1, channels, family.latent_frames, height // ratio, width // ratio)
    return vae, torch.randn(shape, generator=generator).to(vae.dtype)


def spatial_ratio(vae: Any) -> int:
    for name in ("spatial_compression_ratio", "scale_factor_spatial"):
        value = getattr(vae, name, None) or getattr(vae.config, name, None)
        if isinstance(value, int):
            return value
    levels = vae.config.get("block_out_channels") or vae.config["ch_mult"]  # KVAE names its levels ch_mult
    return int(2 ** (len(levels) - 1))


def decoded_video(vae: Any, z: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``vae.decode`` as the family's pipeline calls it, as the BCTHW float video the pipeline hands to
    ``postprocess_video``, and whether that de-normalizes it (``(x / 2 + 0.5).clamp(0, 1)``)."""
    name = type(vae).__name__
    with torch.no_grad():
        if name == "AutoencoderKLTemporalDecoder":  # StableVideoDiffusionPipeline.decode_latents
            batch, _, frames = z.shape[:3]
            flat = z.permute(0, 2, 1, 3, 4).flatten(0, 1)
            video = vae.decode(flat, num_frames=frames).sample
            return video.reshape(batch, frames, *video.shape[1:]).permute(0, 2, 1, 3, 4), True
        video = vae.decode(z).sample
        if name == "AutoencoderKLAllegro":  # AllegroPipeline permutes [B, T, C, H, W]
            return video.permute(0, 2, 1, 3, 4), True
        if name == "AutoencoderKLMiniMaxH3":  # the modular pipeline's decode block
            mean = torch.tensor((0.485, 0.456, 0.406)).view(1, -1, 1, 1, 1)
            std = torch.tensor((0.229, 0.224, 0.225)).view(1, -1, 1, 1, 1)
            return (video.float() * std + mean).clamp(0, 1), False
        return video, True


def call(method: str, vae: Any, z: torch.Tensor, path: Path) -> float:
    """One way to an MP4 file at ``path``; the baseline's seconds in ``export_to_video`` (else 0)."""
    if method == "baseline":
        from diffusers.utils import export_to_video
        from diffusers.video_processor import VideoProcessor

        video, do_normalize = decoded_video(vae, z)
        processor = VideoProcessor(do_normalize=do_normalize)
        frames = processor.postprocess_video(video, output_type="np")[0]  # float32 [0, 1]
        exporting = time.perf_counter()
        export_to_video(frames, str(path), fps=FPS)
        return time.perf_counter() - exporting
    import anyio

    import streamvae

    async def decode() -> list[bytes]:
        return await streamvae.decode_to_mp4(
            vae, z, fps=FPS, video_codec_options=X264, output_files=[str(path)]
        )

    anyio.run(decode)
    return 0.0


def run_child(method: str, name: str, height: int, width: int) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    family = FAMILIES[name]
    small_vae, small = build(family, family.warm_up_size, family.warm_up_size)
    with tempfile.TemporaryDirectory() as tmp:
        call(method, small_vae, small, Path(tmp) / "warm-up.mp4")
        vae, z = build(family, height, width)
        path = Path(tmp) / "out.mp4"
        with measuring() as cost:
            export_seconds = call(method, vae, z, path)
        return {
            "method": method,
            "family": name,
            **cost.record(),
            "export_seconds": export_seconds,
            "peak_rss_mib": cost.peak_rss_mib,
            # the job's memory: this process's growth, and export_to_video's ffmpeg (a process of its own)
            "growth_mib": cost.peak_rss_mib - cost.rss_before_mib + cost.subprocess_peak_mib,
            **written(path),
            "size": [height, width],
        }


# ---------------------------------------------------------------------------------------------------------
# Side by side (the parent)
# ---------------------------------------------------------------------------------------------------------


def spawn(method: str, name: str, height: int, width: int) -> dict[str, Any]:
    command = [
        __file__,
        "--child",
        method,
        "--families",
        name,
        "--height",
        str(height),
        "--width",
        str(width),
    ]
    return spawn_child(command, f"{method} {name}")


def summary(run: dict[str, Any]) -> str:
    return f"{run['wall']:.2f} s, peak RSS {run['peak_rss_mib']:.0f} MiB (+{run['growth_mib']:.0f}), {run['frames']} frames"


def measure(name: str, repeats: int, height: int, width: int) -> Runs:
    """``repeats`` runs of each way, alternating, each in a fresh process; both give the same frames."""
    runs = side_by_side(name, METHODS, repeats, lambda method: spawn(method, name, height, width), summary)
    expected = runs["baseline"][0]["frames"]
    if any(run["frames"] != expected for method_runs in runs.values() for run in method_runs):
        sys.exit(f"{name}: the two ways wrote different frame counts: {runs}")
    return runs


def pair_ratios(runs: Runs, key: str) -> list[float]:
    return [new[key] / old[key] for old, new in zip(runs["baseline"], runs["streamvae"], strict=True)]


def table(results: dict[str, Runs], modes: dict[str, str]) -> str:
    rows = [
        "| family | decode | frames | wall today | wall streamvae | wall ÷ | growth today | "
        "growth streamvae | growth ÷ | peak RSS ÷ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        old, new = runs["baseline"], runs["streamvae"]
        height, width = old[0]["size"]
        rows.append(
            f"| {FAMILIES[name].label} | {modes[name]} | {old[0]['frames']} × {height}×{width} | "
            f"{median(old, 'wall'):.2f} s | {median(new, 'wall'):.2f} s | "
            f"**{statistics.median(pair_ratios(runs, 'wall')):.2f}** | "
            f"{median(old, 'growth_mib'):.0f} MiB | {median(new, 'growth_mib'):.0f} MiB | "
            f"**{statistics.median(pair_ratios(runs, 'growth_mib')):.2f}** | "
            f"{statistics.median(pair_ratios(runs, 'peak_rss_mib')):.2f} |"
        )
    return "\n".join(rows)


def plot(results: dict[str, Runs], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    labels = [FAMILIES[name].label for name in names]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(names) + 1.6), sharey=True)
    for ax, key, title in (
        (axes[0], "growth_mib", "memory growth of the call, streamvae ÷ today"),
        (axes[1], "wall", "wall time, streamvae ÷ today"),
    ):
        values = [statistics.median(pair_ratios(results[name], key)) for name in names]
        ax.barh(labels, values, color="tab:blue")
        ax.axvline(1.0, color="tab:gray", linestyle="--", linewidth=1)
        ax.set_title(title)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.2f}", va="center")
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(results: dict[str, Runs], repeats: int, modes: dict[str, str]) -> str:
    return f"""## Every VAE family: `decode_to_mp4` against `vae.decode` + post-processing + `export_to_video`

`python bench/families.py` ({repeats} repeats of each way per family, alternating, each a fresh process; the
medians, and the ratios per repeat's pair). Each family's tiny seeded test VAE (`tests/_vaes.py`: few
channels, one layer) at a realistic frame size, so that the frame size, not the model, sets the memory.
*Today* is `vae.decode(z).sample`, the family pipeline's post-processing (`postprocess_video(...,
output_type="np")`) and `export_to_video(frames, path, fps=16)`; *streamvae* is `decode_to_mp4(vae, z,
fps=16, output_files=[path])` with the same crf 25 and preset medium. *Growth* is the call's peak RSS over
the process's RSS before it (the VAE and the latent were already there), plus the peak RSS of
`export_to_video`'s ffmpeg process; *peak RSS ÷* compares the Python processes alone. *decode* says whether the family streams (chunks leave while later ones decode) or decodes whole
(its decoder needs the whole latent; its frames still go to the encoder chunk by chunk).

{table(results, modes)}

![memory and wall per family](families.png)
"""


def decode_modes(names: list[str]) -> dict[str, str]:
    """ "streams" or "whole" per family, from its adapter's ``streams`` at the benchmark's settings."""
    import tests._vaes as vaes
    from streamvae.models import chunked_decoder

    modes = {}
    for name in names:
        family = FAMILIES[name]
        adapter = chunked_decoder(getattr(vaes, family.factory)(**dict(family.factory_kwargs)))
        modes[name] = "streams" if adapter.streams else "whole"
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way per family")
    parser.add_argument("--quick", action="store_true", help="one repeat at 256×256; print, write nothing")
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES)
    )
    parser.add_argument("--height", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=list(METHODS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.families.split(",")
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    if args.child:
        print(json.dumps(run_child(args.child, names[0], args.height, args.width)))
        return

    repeats = 1 if args.quick else args.repeats
    started = time.perf_counter()
    saved = DOCS / "families.json"
    results: dict[str, Runs] = {}
    if not args.quick and saved.exists():
        results = {name: runs for name, runs in json.loads(saved.read_text()).items() if name in FAMILIES}
    for name in names:
        family = FAMILIES[name]
        quick = max(256, family.warm_up_size)
        height, width = (quick, quick) if args.quick else (family.height, family.width)
        results[name] = measure(name, repeats, height, width)
        if not args.quick:  # kept as each family ends: a later failure loses no runs
            saved.write_text(json.dumps(results, indent=1) + "\n")
    print(f"measured in {time.perf_counter() - started:.0f} s", flush=True)
    results = {name: results[name] for name in FAMILIES if name in results}  # the table's order
    body = report(results, repeats, decode_modes(list(results)))
    if args.quick:
        print(body)
        return
    saved.write_text(json.dumps(results, indent=1) + "\n")
    plot(results, DOCS / "families.png")
    print(f"wrote {write_section('families', body)} and {DOCS / 'families.png'}")


if __name__ == "__main__":
    main()
