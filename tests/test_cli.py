"""The ``streamvae`` command: demo, decode from saved latents with a saved VAE (de-normalized as each
pipeline does), its input errors, Ctrl-C, what ``--help`` imports, and the server's log."""

from __future__ import annotations

import errno
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import numpy as np
import pytest
import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    AutoencoderKLHunyuanVideo,
    CogVideoXPipeline,
    StableVideoDiffusionPipeline,
)
from safetensors.torch import save_file

from streamvae import cli, quantize_chunk
from streamvae.cli import main
from streamvae.models import as_decoder
from tests._cli import check_signal_mid_decode, one_line_error, streamvae_command
from tests._media import bt709_luma, read_luma, read_mp4
from tests._vaes import (
    latent,
    tiny_allegro,
    tiny_magvit,
    tiny_minimax_h3,
    tiny_mochi,
    tiny_stable_video,
    tiny_wan21,
    tiny_wan22,
)

FAST = ["--crf", "23", "--preset", "ultrafast", "--quiet"]


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_wan21 saved the way diffusers saves a VAE (``save_pretrained``)."""
    directory = tmp_path_factory.mktemp("vae")
    tiny_wan21().save_pretrained(directory)
    return directory


def write_wav(path: Path, seconds: float, rate: int = 16000, channels: int = 1) -> None:
    samples = (np.sin(np.linspace(0, 440 * seconds, int(rate * seconds))) * 12000).astype("<i2")
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.repeat(samples[:, None], channels, axis=1).tobytes())


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_demo_writes_a_playable_mp4_and_a_summary(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "demo.mp4"
    args = ["demo", "-o", str(output), "--frames", "17", "--size", "64", "--backend", backend]
    assert main(args) == 0
    video = read_mp4(output.read_bytes())
    assert video.frames.shape == (17, 64, 64, 3)
    assert video.fps == 16
    out, err = capsys.readouterr()
    assert f"{output}: 17 frames 64×64 in " in out and "first byte after " in out
    assert "frames decoded" in err and "frames encoded" in err and "17/17" in err  # the progress bar


def test_demo_as_a_plain_mp4(tmp_path: Path) -> None:
    output = tmp_path / "plain.mp4"
    assert (
        main(["demo", "-o", str(output), "--frames", "9", "--size", "32", "--container", "mp4", *FAST]) == 0
    )
    data = output.read_bytes()
    assert b"moof" not in data  # one moov, no fragments
    assert read_mp4(data).frames.shape == (9, 32, 32, 3)


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_decode_reads_latents_and_a_saved_vae(kind: str, vae_dir: Path, tmp_path: Path) -> None:
    vae = tiny_wan21()
    z = latent(vae, frames=3)
    if kind == "pt":
        source = tmp_path / "latents.pt"
        torch.save(z, source)
        key: list[str] = []
    else:  # several tensors: the latent is picked by name
        source = tmp_path / "latents.safetensors"
        save_file({"noise": torch.zeros(2), "video_latents": z.contiguous()}, str(source))
        key = ["--key", "video_latents"]
    output = tmp_path / "out.mp4"
    args = ["decode", str(source), "-o", str(output), "--vae", str(vae_dir), "--tile", "--fps", "8", *key]
    args += ["--device", "cpu"]
    assert main([*args, "--crf", "0", "--quiet"]) == 0  # crf 0: lossless luma
    data = output.read_bytes()
    video = read_mp4(data)
    assert video.frames.shape == (9, 64, 64, 3)
    assert video.fps == 8
    with torch.no_grad():
        expected = quantize_chunk(vae.decode(z).sample, (-1, 1)).numpy()[0]
    # The saved VAE's weights decoded the saved latent: the luma is that of its own decode.
    assert np.abs(read_luma(data).astype(int) - bt709_luma(expected).astype(int)).max() <= 1


def test_decode_writes_one_mp4_per_batch_entry_with_the_audio(
    vae_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "batch.pt"
    torch.save({"latents": latent(tiny_wan21(), batch=2, frames=2)}, source)
    audio = tmp_path / "tone.wav"
    write_wav(audio, seconds=2.0, channels=2)
    args = [
        "decode",
        str(source),
        "-o",
        str(tmp_path / "out.mp4"),
        "--vae",
        str(vae_dir),
        "--audio",
        str(audio),
    ]
    assert main([*args, *FAST]) == 0
    assert not (tmp_path / "out.mp4").exists()
    for entry in range(2):
        video = read_mp4((tmp_path / f"out-{entry}.mp4").read_bytes())
        assert video.frames.shape == (5, 64, 64, 3)
        assert video.audio_channels == 2
        assert video.audio_duration == pytest.approx(5 / 16, abs=0.07)  # trimmed to the video
    assert "out-0.mp4, " in capsys.readouterr().out


def test_decode_without_a_batch_dimension_is_one_entry(vae_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "single.pt"
    torch.save(latent(tiny_wan21(), frames=2)[0], source)  # [C, T, H, W]
    output = tmp_path / "single.mp4"
    assert main(["decode", str(source), "-o", str(output), "--vae", str(vae_dir), *FAST]) == 0
    assert read_mp4(output.read_bytes()).frames.shape == (5, 64, 64, 3)


# What a pipeline's output_type="latent" hands out, and the pipeline's own step from there to the video
# (diffusers 0.42): (VAE, latents in the pipeline's layout, the step + vae.decode, latents channels first).
PipelineCase = tuple[Any, torch.Tensor, Callable[[Any, torch.Tensor], torch.Tensor], torch.Tensor]


def _wan_case() -> PipelineCase:
    vae = tiny_wan22()  # its latents_mean / latents_std are seeded, not the defaults
    latents = latent(vae, frames=3, h=4, w=4)

    def wan_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:  # WanPipeline.__call__
        latents = latents.to(vae.dtype)
        latents_mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1)
        latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1)
        return vae.decode(latents / latents_std + latents_mean).sample  # type: ignore[no-any-return]

    return vae, latents, wan_pipeline, latents


def _tiny_vae_and_latents(vae_class: Any, *latent_shape: int) -> tuple[Any, torch.Tensor]:
    """A seeded tiny VAE of ``vae_class`` (4 latent channels) and a seeded latent of ``latent_shape``."""
    torch.manual_seed(0)
    vae = vae_class(latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4)
    return vae.eval(), torch.randn(*latent_shape, generator=torch.Generator().manual_seed(0))


def _hunyuan_video_case() -> PipelineCase:
    vae, latents = _tiny_vae_and_latents(AutoencoderKLHunyuanVideo, 1, 4, 3, 4, 4)

    def hunyuan_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:  # HunyuanVideoPipeline.__call__
        return vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor).sample  # type: ignore[no-any-return]

    return vae, latents, hunyuan_pipeline, latents


def _cogvideox_case() -> PipelineCase:
    vae, latents = _tiny_vae_and_latents(AutoencoderKLCogVideoX, 1, 3, 4, 4, 4)  # frames first

    def cogvideox_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:
        # The pipeline's own method, on a stand-in holding the two attributes it reads.
        pipe = SimpleNamespace(vae=vae, vae_scaling_factor_image=vae.config.scaling_factor)
        return CogVideoXPipeline.decode_latents(pipe, latents)  # type: ignore[arg-type]

    return vae, latents, cogvideox_pipeline, latents.permute(0, 2, 1, 3, 4)


def _seeded(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _minimax_h3_case() -> PipelineCase:
    stats = _seeded((2, 4), seed=3)
    vae = tiny_minimax_h3(latents_mean=stats[0].tolist(), latents_std=(stats[1].abs() + 0.5).tolist())  # type: ignore[arg-type]
    latents = _seeded((1, 4, 3, 4, 4))

    def minimax_h3_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:  # MiniMaxH3VideoDecodeStep
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        return vae.decode(latents * std + mean, return_dict=False)[0]  # type: ignore[no-any-return]

    return vae, latents, minimax_h3_pipeline, latents


def _mochi_case() -> PipelineCase:
    vae, latents = tiny_mochi(), _seeded((1, 12, 2, 4, 4))

    def mochi_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:  # MochiPipeline.__call__
        mean = torch.tensor(vae.config.latents_mean).view(1, 12, 1, 1, 1).to(latents.device, latents.dtype)
        std = torch.tensor(vae.config.latents_std).view(1, 12, 1, 1, 1).to(latents.device, latents.dtype)
        return vae.decode(latents * std / vae.config.scaling_factor + mean).sample  # type: ignore[no-any-return]

    return vae, latents, mochi_pipeline, latents


def _allegro_case() -> PipelineCase:
    vae, latents = tiny_allegro(), _seeded((1, 4, 4, 7, 7))

    def allegro_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:  # AllegroPipeline.decode_latents
        video = vae.decode(1 / vae.config.scaling_factor * latents.to(vae.dtype)).sample
        return video.permute(0, 2, 1, 3, 4)  # type: ignore[no-any-return]

    return vae, latents, allegro_pipeline, latents


def _magvit_case() -> PipelineCase:
    vae, latents = tiny_magvit(), _seeded((1, 4, 3, 4, 4))

    def easyanimate_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:  # EasyAnimatePipeline
        return vae.decode(1 / vae.config.scaling_factor * latents).sample  # type: ignore[no-any-return]

    return vae, latents, easyanimate_pipeline, latents


def _stable_video_case() -> PipelineCase:
    vae, latents = tiny_stable_video(), _seeded((1, 3, 4, 4, 4))  # frames first

    def svd_pipeline(vae: Any, latents: torch.Tensor) -> torch.Tensor:
        pipe = SimpleNamespace(vae=vae)  # the pipeline's own method, on a stand-in holding its VAE
        return StableVideoDiffusionPipeline.decode_latents(pipe, latents, num_frames=3)  # type: ignore[arg-type]

    return vae, latents, svd_pipeline, latents.permute(0, 2, 1, 3, 4)


@pytest.mark.parametrize(
    "case",
    [
        _wan_case,
        _hunyuan_video_case,
        _cogvideox_case,
        _minimax_h3_case,
        _mochi_case,
        _magvit_case,
        _stable_video_case,
    ],
)
def test_decode_denormalizes_a_pipelines_latents_as_the_pipeline_does(
    case: Callable[[], PipelineCase], tmp_path: Path
) -> None:
    vae, latents, pipeline_decode, channels_first = case()
    vae.save_pretrained(tmp_path / "vae")
    torch.save(latents, tmp_path / "latents.pt")  # what output_type="latent" handed out
    output = tmp_path / "out.mp4"
    args = ["decode", str(tmp_path / "latents.pt"), "-o", str(output), "--vae", str(tmp_path / "vae")]
    assert main([*args, "--denormalize", "--crf", "0", "--quiet"]) == 0  # crf 0: lossless luma
    with torch.no_grad():
        value_range = as_decoder(vae).chunk_value_range
        expected = bt709_luma(quantize_chunk(pipeline_decode(vae, latents), value_range).numpy()[0]).astype(
            int
        )
        skipped_video = torch.cat(list(as_decoder(vae).iter_chunks(channels_first)), dim=2)  # no step
        skipped = bt709_luma(quantize_chunk(skipped_video, value_range).numpy()[0])
    luma = read_luma(output.read_bytes()).astype(int)
    assert luma.shape == expected.shape
    assert np.abs(luma - expected).max() <= 1  # the pipeline's own frames
    assert np.abs(luma - skipped.astype(int)).max() > 4  # and the step mattered


def test_denormalize_gives_allegros_decode_input_and_the_command_tiles_as_its_pipeline() -> None:
    # AllegroPipeline decodes only tiled (its examples call vae.enable_tiling(); vae.decode raises without
    # it), with tiles larger than a test latent: the formula is checked on its own, and the loading step.
    from streamvae.cli._denormalize import denormalize_latents
    from streamvae.cli._inputs import prepare_loaded_vae

    vae, latents, _, _ = _allegro_case()
    expected = 1 / vae.config.scaling_factor * latents.to(vae.dtype)  # AllegroPipeline.decode_latents
    assert torch.equal(denormalize_latents(vae, latents), expected)
    vae.disable_tiling()
    prepare_loaded_vae(vae)
    assert vae.use_tiling


@pytest.mark.parametrize(
    ("vae_class", "reason"),
    [
        ("AutoencoderKLLTXVideo", "use the pipeline API (streamvae.pipelines.generate_mp4) instead"),
        ("AutoencoderKLLTX2Video", "use the pipeline API (streamvae.pipelines.generate_mp4) instead"),
        ("AutoencoderKLCosmos", "its scheduler's sigma_data"),
        ("AutoencoderKLKVAEVideo", "decode its latents as they are, without --denormalize"),
    ],
)
def test_denormalize_refuses_a_family_it_cannot_rebuild_in_one_line(
    vae_class: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused from the VAE's config alone, before any weight is read: a config without weights will do.
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps({"_class_name": vae_class}))
    torch.save(torch.randn(1, 8, 2, 2, 2), tmp_path / "latents.pt")
    output = tmp_path / "out.mp4"
    output.write_bytes(b"an earlier render")
    before = sorted(os.listdir(tmp_path))
    args = ["decode", str(tmp_path / "latents.pt"), "-o", str(output), "--vae", str(tmp_path / "vae")]
    assert main([*args, "--denormalize"]) == 1
    err = one_line_error(capsys)
    assert "--denormalize" in err and reason in err
    assert sorted(os.listdir(tmp_path)) == before and output.read_bytes() == b"an earlier render"


def _not_a_vae(tmp_path: Path) -> Path:
    directory = tmp_path / "unet"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    return directory


def _pipeline(tmp_path: Path) -> Path:
    directory = tmp_path / "pipeline"
    (directory / "vae").mkdir(parents=True)
    (directory / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLWan"}))
    return directory


@pytest.mark.parametrize(
    ("latents", "vae", "extra", "message"),
    [
        ("missing.pt", "VAE", [], "latents file .*missing.pt does not exist"),
        ("latents.npy", "VAE", [], "must be .pt .* or .safetensors"),
        ("flat.pt", "VAE", [], r"\[batch, channels, frames, height, width\].*\(16, 5\)"),
        ("channels.pt", "VAE", [], "has 4 channels .* takes 16"),
        ("pair.pt", "VAE", [], "several tensors .*a, b.*--key"),
        ("pair.pt", "VAE", ["--key", "c"], "no tensor 'c'"),
        ("latents.pt", "nowhere", [], "VAE directory .*nowhere does not exist"),
        ("latents.pt", "EMPTY", [], "not a diffusers VAE directory: it has no config.json"),
        ("latents.pt", "PIPELINE", [], "add --subfolder vae"),
        ("latents.pt", "UNET", [], "holds a UNet2DModel, not a VAE streamvae decodes"),
        ("latents.pt", "VAE", ["--audio", "missing.wav"], "audio file .*missing.wav does not exist"),
    ],
)
def test_decode_reports_bad_input_in_one_line(
    latents: str,
    vae: str,
    extra: list[str],
    message: str,
    vae_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.save(latent(tiny_wan21(), frames=2), tmp_path / "latents.pt")
    (tmp_path / "latents.npy").write_bytes(b"\x93NUMPY")
    torch.save(torch.zeros(16, 5), tmp_path / "flat.pt")
    torch.save(torch.zeros(1, 4, 2, 8, 8), tmp_path / "channels.pt")
    torch.save({"a": torch.zeros(1), "b": torch.zeros(1)}, tmp_path / "pair.pt")
    (tmp_path / "empty").mkdir()
    directories = {
        "VAE": vae_dir,
        "EMPTY": tmp_path / "empty",
        "PIPELINE": _pipeline(tmp_path),
        "UNET": _not_a_vae(tmp_path),
    }
    vae_path = directories.get(vae, tmp_path / vae)
    extra = [str(tmp_path / e) if e.endswith(".wav") else e for e in extra]
    args = [
        "decode",
        str(tmp_path / latents),
        "-o",
        str(tmp_path / "out.mp4"),
        "--vae",
        str(vae_path),
        *extra,
    ]
    assert main([*args, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("streamvae: error: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert not (tmp_path / "out.mp4").exists()


def test_demo_rejects_a_size_the_vae_cannot_make(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--size", "100", "--quiet"]) == 1
    assert "multiple of 16" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
        (["--fps", "0"], "argument --fps: fps must be a number between 1/1000 and 1000"),
        (["--fps", "1e-4"], "argument --fps: fps must be a number between 1/1000 and 1000"),
        (["--fps", "nan"], "argument --fps: fps must be a number between 1/1000 and 1000"),
        (["--fps", "fast"], "argument --fps: not a number: 'fast'"),
        (["--crf", "52"], r"argument --crf: must be from 0 \(lossless\) to 51, got 52"),
        (["--crf", "-1"], r"argument --crf: must be from 0 \(lossless\) to 51, got -1"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_a_bad_option_is_one_line_and_writes_nothing(
    option: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    earlier = tmp_path / "earlier.mp4"
    earlier.write_bytes(b"an earlier render")
    for output in (tmp_path / "x.mp4", earlier):
        assert main(["demo", "-o", str(output), "--frames", "5", "--size", "32", *option]) == 1
        assert re.search(message, one_line_error(capsys))
    assert os.listdir(tmp_path) == ["earlier.mp4"]
    assert earlier.read_bytes() == b"an earlier render"


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("a file/x.mp4", "a file/x.mp4: Not a directory"),
        ("a directory", "a directory: Is a directory"),
        ("missing/x.mp4", "missing/x.mp4: No such file or directory"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_one_line(
    output: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a file").write_bytes(b"not a directory")
    (tmp_path / "a directory").mkdir()
    before = sorted(os.listdir(tmp_path))
    # Without --quiet: the check comes before the progress bar would draw anything.
    assert main(["demo", "-o", str(tmp_path / output), "--frames", "5", "--size", "32"]) == 1
    assert one_line_error(capsys).rstrip().endswith(message)
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(tmp_path / "a directory") == []
    assert (tmp_path / "a file").read_bytes() == b"not a directory"


def test_a_session_option_the_session_refuses_fails_before_the_decode(
    vae_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "latents.pt"
    torch.save(latent(tiny_wan21(), frames=2), source)
    audio = tmp_path / "zero-rate.wav"
    write_wav(audio, seconds=0.5)
    header = bytearray(audio.read_bytes())
    header[24:28] = bytes(4)  # a header that says 0 samples a second: wave reads it, the session refuses
    audio.write_bytes(bytes(header))
    decodes: list[object] = []

    async def recording_decode(job: object, *, progress: bool) -> None:
        decodes.append(job)

    monkeypatch.setattr(cli, "run_decode", recording_decode)
    output = tmp_path / "out.mp4"
    args = ["decode", str(source), "-o", str(output), "--vae", str(vae_dir), "--audio", str(audio)]
    assert main([*args, "--quiet"]) == 1
    assert "audio_sample_rate must be" in one_line_error(capsys)
    assert decodes == [] and not output.exists()


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (av.error.ExternalError(-1, "the encoder refused"), "the encoder failed: .*the encoder refused"),
        (ValueError("video_codec_options: libx264 has no option\n'x'"), "has no option 'x'$"),
        (ExceptionGroup("stages", [OSError(errno.ENOSPC, "No space left on device")]), "No space left"),
    ],
)
def test_an_error_of_the_decode_is_one_line(
    error: Exception,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def failing_decode(job: object, *, progress: bool) -> None:
        raise error

    monkeypatch.setattr(cli, "run_decode", failing_decode)
    assert main(["demo", "-o", str(tmp_path / "x.mp4"), "--frames", "5", "--size", "32", "-q"]) == 1
    assert re.search(message, one_line_error(capsys).rstrip())


def test_a_bug_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def failing_decode(job: object, *, progress: bool) -> None:
        raise RuntimeError("a bug, not a problem with the input")

    monkeypatch.setattr(cli, "run_decode", failing_decode)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["demo", "-o", str(tmp_path / "x.mp4"), "--frames", "5", "--size", "32", "-q"])


# The runs that need an interpreter of their own share one (its torch and diffusers imports are most of a
# run): without the optional packages, a demo and ``serve``; then, last (the limit cannot be lifted), a
# demo whose final write fails under a file size limit. Each run's fd 1 and 2 go to files of its own, as a
# process's would; the script prints each run's exit status.
_FRESH_INTERPRETER = """
import json, os, resource, runpy, signal, sys
for name in ("rich", "starlette", "uvicorn", "httpx"):
    sys.modules[name] = None  # importing it now raises ImportError
logs, (bare, too_large) = sys.argv[1], sys.argv[2:]

def redirected(fds):
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, target in enumerate(fds, start=1):
        os.dup2(target, fd)

def run(name, *argv):
    saved = [os.dup(1), os.dup(2)]
    with open(f"{logs}/{name}.out", "w") as out, open(f"{logs}/{name}.err", "w") as err:
        redirected([out.fileno(), err.fileno()])
        sys.argv = ["streamvae", *argv]
        try:
            runpy.run_module("streamvae", run_name="__main__")
        except SystemExit as exit:
            return exit.code
        finally:
            redirected(saved)

codes = {"bare": run("bare", "demo", "-o", bare, "--frames", "5", "--size", "32")}
codes["serve"] = run("serve", "serve")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
plain = ["--container", "mp4", "-q"]  # a plain MP4 is written whole, by the final write
codes["too_large"] = run("too_large", "demo", "-o", too_large, "--frames", "17", "--size", "32", *plain)
print(json.dumps(codes))
"""


@dataclass(frozen=True)
class FreshRun:
    """One run of the ``streamvae`` command in the shared fresh interpreter."""

    status: int | None  # its exit status
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def fresh_interpreter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, FreshRun]]:
    """The runs of _FRESH_INTERPRETER by name, and the folder of their outputs (``bare.mp4``, and
    ``too_large/x.mp4``, an earlier render before the run)."""
    folder, logs = tmp_path_factory.mktemp("fresh"), tmp_path_factory.mktemp("fresh_logs")
    (folder / "too_large").mkdir()
    (folder / "too_large" / "x.mp4").write_bytes(b"an earlier render")
    outputs = [str(folder / "bare.mp4"), str(folder / "too_large" / "x.mp4")]
    script = [sys.executable, "-c", _FRESH_INTERPRETER, str(logs), *outputs]
    result = subprocess.run(script, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = {}
    for name, status in json.loads(result.stdout).items():
        runs[name] = FreshRun(status, (logs / f"{name}.out").read_text(), (logs / f"{name}.err").read_text())
    return folder, runs


def test_an_earlier_output_survives_a_run_that_fails_at_the_final_write(
    fresh_interpreter: tuple[Path, dict[str, FreshRun]],
) -> None:
    """A file size limit (a full disk) hit by the last write: the earlier file stays, nothing partial."""
    folder, runs = fresh_interpreter
    run = runs["too_large"]
    assert run.status == 1, run.stderr[-4000:]
    assert run.stderr == "streamvae: error: [Errno 27] File too large\n"
    assert (folder / "too_large" / "x.mp4").read_bytes() == b"an earlier render"
    assert os.listdir(folder / "too_large") == ["x.mp4"]


def test_python_m_streamvae_runs_without_rich_starlette_or_uvicorn(
    fresh_interpreter: tuple[Path, dict[str, FreshRun]],
) -> None:
    """The library and the CLI import none of the optional packages unless ``serve`` is used."""
    folder, runs = fresh_interpreter
    assert runs["bare"].status == 0, runs["bare"].stderr
    assert runs["serve"].status == 1, runs["serve"].stderr
    assert "5 frames 32×32" in runs["bare"].stdout  # the summary, without a progress bar
    assert "pip install -e '.[serve]'" in runs["serve"].stderr
    assert read_mp4((folder / "bare.mp4").read_bytes()).frames.shape == (5, 32, 32, 3)


# Devices this machine lacks, whatever it has: a name torch does not know, a malformed index, meta.
MISSING_DEVICES = [
    ("gpu", r"argument --device: 'gpu' is not a device: expected cpu"),
    ("cuda:x", r"argument --device: 'cuda:x' is not a device: expected cpu"),
    ("meta", r"argument --device: meta: this torch \(.+\) sees no meta device; expected cpu"),
    (
        "cuda:99",
        r"argument --device: cuda:99: this (torch \(.+\) sees no cuda device|machine has \d+ cuda dev)",
    ),
]
if not torch.cuda.is_available():
    MISSING_DEVICES.append(
        ("cuda", r"argument --device: cuda: this torch \(.+\) sees no cuda device; expected cpu")
    )


@pytest.mark.parametrize(("device", "message"), MISSING_DEVICES)
def test_a_device_this_machine_lacks_is_one_line_before_anything_is_read(
    device: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Neither the latents nor the VAE exist: the device is checked first, when the options are parsed.
    args = ["decode", str(tmp_path / "missing.pt"), "-o", str(tmp_path / "out.mp4"), "--vae", str(tmp_path)]
    assert main([*args, "--device", device]) == 1
    err = one_line_error(capsys)
    assert re.search(message, err), err
    assert err.rstrip().endswith("(see streamvae decode --help)")
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # a fresh interpreter per run
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_ctrl_c_while_decoding_is_one_line_exit_130_and_leaves_the_earlier_file(
    backend: str, tmp_path: Path
) -> None:
    check_signal_mid_decode(tmp_path, backend, signal.SIGINT, status=130, said="streamvae: interrupted\n")


def test_help_and_option_errors_import_neither_torch_nor_diffusers() -> None:
    """``--help`` and a mistyped option answer without importing the heavy modules (seconds otherwise):
    not torch or diffusers, neither through the command nor through ``import streamvae`` (PyAV, ~0.1 s,
    only where the option is checked against the codec's own presets)."""
    script = """
import contextlib, io, json, sys
import streamvae
before = set(sys.modules)
from streamvae.cli import main
statuses, helps = [], []
for argv in (["--help"], ["decode", "--help"], ["demo", "--help"], ["demo", "--preset", "nope"],
             ["decode", "latents.pt"], ["decode", "x.pt", "-o", "x.mp4", "--vae", ".", "--fps", "0"]):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
        try:
            statuses.append(main(argv))
        except SystemExit as exit:
            statuses.append(exit.code)
    helps.append(out.getvalue())
added = sorted(set(sys.modules) - before)
print(json.dumps({"statuses": statuses, "added": added, "all": sorted(sys.modules), "helps": helps}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["statuses"] == [0, 0, 0, 1, 1, 1]
    heavy = ("torch", "diffusers", "transformers", "safetensors")
    loaded = [name for name in seen["all"] if name.split(".")[0] in heavy]
    assert loaded == [] and not [
        name for name in seen["all"] if name.startswith(("streamvae.demo", "streamvae.models"))
    ]
    from streamvae.demo import DEMO_FPS

    assert f"(default {DEMO_FPS}, the demo's)" in seen["helps"][2]  # the help states the demo's own rate


def test_serve_logs_each_requests_statistics() -> None:
    """``streamvae serve`` sets up logging: the per-request statistics line appears on its stderr."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    command = streamvae_command("serve", "--port", "0")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    def line_with(pattern: str) -> re.Match[str]:
        while True:
            line = lines.get(timeout=120)  # a hang guard only
            match = re.search(pattern, line)
            if match is not None:
                return match

    try:
        port = line_with(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")[1]
        video = httpx.get(f"http://127.0.0.1:{port}/video.mp4?frames=5&size=32&seed=7", timeout=120)
        assert video.status_code == 200 and read_mp4(video.content).frames.shape == (5, 32, 32, 3)
        stats = line_with(r"INFO: +request 1 VideoRequest\(frames=5, size=32, seed=7.*\) completed: (.*)")[1]
        assert "first push after " in stats and f"5 frames, {len(video.content)} bytes" in stats
    finally:
        process.send_signal(signal.SIGINT)  # uvicorn's own graceful shutdown
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        reader.join(timeout=60)
    assert process.returncode == 0
