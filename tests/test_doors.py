"""The doors: every public entry point refuses a bad argument when it is called, before any work.

One rule everywhere: a bad value of any type is a ValueError, the wrong kind of object where an object is
expected (a VAE, a tensor, a limiter, ``options=``, an unknown keyword) a TypeError; the message names the
function the user called and the argument. "Before any work" is counted: a counting decoder's calls, the
tiny Wan VAE's decoder calls (a forward pre-hook), the session's pushed frames and pipeline, the ring's
slots, and the files in ``tmp_path`` (no output file, no ``.part``). Positive controls show each door
opens for a good argument, so none of these tests passes by refusing everything.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch
import trio
from diffusers import AutoencoderKLHunyuanVideo, AutoencoderKLWan
from torch import Tensor

from streamvae import (
    ChunkedVideoMP4Session,
    PinnedChunkRing,
    SessionOptions,
    decode_to_mp4,
    open_latent_stream,
    quantize_chunk,
    quantize_chunk_yuv420,
    stream_mp4,
)
from streamvae.models import as_decoder, chunked_decoder
from streamvae.testing import TINY_VAE_CONFIGS
from tests._media import read_mp4

FAST = {"video_codec_options": {"preset": "ultrafast", "threads": "1"}}
CHANNELS = 4  # the counting decoder's latent channels
WAN_CHANNELS = 16  # the tiny Wan 2.1's (z_dim)
LATENT = torch.zeros(1, CHANNELS, 2, 2, 2)  # the counting decoder: 2 latent frames, 2 frames of 16×16
WAN_PIECE = torch.zeros(1, WAN_CHANNELS, 1, 2, 2)  # the tiny Wan: 1 latent frame, 1 frame of 16×16
CHUNK = torch.zeros(1, 3, 1, 16, 16)


class CountingDecoder:
    """A :class:`streamvae.SupportsChunkedVAEDecode` counting its decodes; a 16×16 frame a latent frame."""

    chunk_value_range = (-1.0, 1.0)
    latent_channels = CHANNELS

    def __init__(self, *, is_output_rank: bool = True) -> None:
        self.is_output_rank = is_output_rank
        self.calls = 0

    def decode_with_chunks(self, z: Tensor, *, on_chunk: Callable[[Tensor], None]) -> None:
        self.calls += 1
        for _ in range(z.shape[2]):
            on_chunk(torch.zeros(z.shape[0], 3, 1, 16, 16))


@dataclass
class CountedWan:
    """A tiny diffusers ``AutoencoderKLWan`` whose decoder calls are counted (a forward pre-hook)."""

    vae: AutoencoderKLWan
    calls: list[int] = field(default_factory=list)


@pytest.fixture(scope="module")
def counted_wan() -> CountedWan:
    torch.manual_seed(0)
    counted = CountedWan(AutoencoderKLWan(**TINY_VAE_CONFIGS["wan21"]).eval())
    counted.vae.decoder.register_forward_pre_hook(lambda module, args: counted.calls.append(1))
    return counted


@pytest.fixture
def wan(counted_wan: CountedWan) -> Iterator[CountedWan]:
    counted_wan.calls.clear()
    yield counted_wan
    counted_wan.calls.clear()


@pytest.fixture
def decoder() -> CountingDecoder:
    return CountingDecoder()


def nothing_written(directory: Path) -> bool:
    """No output file and no temporary ``.part`` file was left in ``directory``."""
    return not any(directory.iterdir())


# -- what is refused, by kind --

NOT_FLOATING = [torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64]


def refused(value: object, error: type[Exception], match: str, name: str) -> Any:
    """One refused argument: the value, the error it raises and the start of its message after the call's
    name."""
    return pytest.param(value, error, match, id=name)


def bad_latents(channels: int) -> list[Any]:
    """Latents a decoder of ``channels`` latent channels refuses, as :func:`refused` cases."""
    not_a_tensor = [None, [[0.0]], 0.0, "z", np.zeros((1, channels, 1, 2, 2), np.float32)]
    channel_count = f"z must have {channels} latent channels"
    cases = [
        *(refused(z, TypeError, "z must be a torch.Tensor", f"a {type(z).__name__}") for z in not_a_tensor),
        refused(torch.tensor(0.0), ValueError, "z must be a 5-D latent", "0-D"),
        refused(torch.zeros(channels, 1, 2, 2), ValueError, "z must be a 5-D latent", "4-D"),
        refused(torch.zeros(1, channels, 1, 2, 2, 1), ValueError, "z must be a 5-D latent", "6-D"),
        *(
            refused(
                torch.zeros(1, channels, 1, 2, 2, dtype=d), ValueError, "z must be a floating-point", str(d)
            )
            for d in NOT_FLOATING
        ),
        refused(torch.zeros(1, channels + 1, 1, 2, 2), ValueError, channel_count, "one channel more"),
        refused(torch.zeros(1, 3, 1, 2, 2), ValueError, channel_count, "3 channels"),
    ]
    for dim, name in enumerate(("batch", "channels", "frames", "height", "width")):
        shape = [1, channels, 1, 2, 2]
        shape[dim] = 0
        expected = channel_count if name == "channels" else "z must not be empty"
        cases.append(refused(torch.zeros(shape), ValueError, expected, f"no {name}"))
    return cases


def bad_chunks() -> list[Any]:
    """Video chunks every door that takes them refuses, as :func:`refused` cases."""
    not_a_tensor = [None, [[0.0]], 0.0, np.zeros((1, 3, 1, 2, 2), np.float32)]
    rgb = r"chunk must have 3 \(RGB\) channels"
    cases = [
        *(
            refused(c, TypeError, "chunk must be a torch.Tensor", f"a {type(c).__name__}")
            for c in not_a_tensor
        ),
        refused(torch.tensor(0.0), ValueError, "chunk must be 5-D", "0-D"),
        refused(torch.zeros(3, 1, 16, 16), ValueError, "chunk must be 5-D", "4-D"),
        refused(torch.zeros(1, 3, 1, 16, 16, 1), ValueError, "chunk must be 5-D", "6-D"),
        *(
            refused(torch.zeros(1, 3, 1, 16, 16, dtype=d), ValueError, "chunk must be floating point", str(d))
            for d in NOT_FLOATING
        ),
        refused(torch.zeros(1, 1, 1, 16, 16), ValueError, rgb, "1 channel"),
        refused(torch.zeros(1, 4, 1, 16, 16), ValueError, rgb, "4 channels"),
    ]
    for dim, name in ((0, "batch"), (2, "frames"), (3, "height"), (4, "width")):
        shape = [1, 3, 1, 16, 16]
        shape[dim] = 0
        cases.append(
            refused(torch.zeros(shape), ValueError, "chunk must hold at least one frame", f"no {name}")
        )
    return cases


NAN, INF = math.nan, math.inf
BAD_VALUE_RANGES = ["01", "ab", ("0", "1"), (False, True), (1, -1), (0, 0), (NAN, 1), (0, INF), (0, 1e39)]
BAD_VALUE_RANGES += [None, 1.0, (0,), (0, 1, 2), (0j, 1), torch.zeros(2, 2)]


def option(name: str, value: object, **companions: object) -> Any:
    return pytest.param({name: value, **companions}, name, id=f"{name}={value!r}"[:60])


def waveform(value: object) -> Any:
    return pytest.param(
        {"audio_waveforms": [value], "audio_sample_rate": 8000},
        "audio_waveforms",
        id=f"audio_waveforms=[{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}]",
    )


#: Option values every door refuses with a ValueError naming the option: (the options, the option's name).
BAD_OPTIONS = [
    *(option("fps", v) for v in ["16", None, True, 0, -16, NAN, INF, 1e-4, 1001, Fraction(0), 16j, [16]]),
    *(option("value_range", v) for v in BAD_VALUE_RANGES),
    *(option("batch_frames", v) for v in [0, -1, 1.5, "2", True, None]),
    *(option("transfer_slots", v) for v in [-1, 1.5, "2", True, None]),
    *(option("queue_depth", v) for v in [-1, 0.5, True, "1"]),
    *(option("crop", v) for v in ["64x64", ("a", 1), (0, 16), (-2, 16), (16,), (16, 16, 16), (True, 16)]),
    *(option("crop", v) for v in [(16.0, 16), 16, {16, 8}]),
    *(option("keyframe_interval", v) for v in [0, -1, True, 2.5, "1"]),
    *(option("fragment_frames", v, output="fragmented") for v in [0, True, "2", 1.5]),
    option("fragment_frames", 2, output="mp4"),
    *(option("pixel_format", v) for v in [3, "RGB24", "yuv444p", None]),
    *(option("output", v) for v in ["webm", None, 1, True]),
    *(option("nonfinite", v) for v in ["raise", True, None]),
    *(option("record_timeline", v) for v in [1, "yes", None]),
    *(option("video_codec", v) for v in [3, "", "nope", "aac", None]),
    *(option("video_codec_options", v) for v in [{"crf": 18}, "crf=18", [("crf", "18")], {"nope": "1"}]),
    option("audio_waveforms", np.zeros(10, np.float32), audio_sample_rate=8000),
    option("audio_waveforms", "ab", audio_sample_rate=8000),
    *(waveform(torch.zeros(10, dtype=dtype)) for dtype in [torch.int64, torch.bool, torch.complex64]),
    *(waveform(np.zeros(10, dtype)) for dtype in [np.int16, np.bool_, np.complex64]),
    *(
        waveform(v)
        for v in [np.zeros((3, 10), np.float32), np.zeros((1, 2, 3), np.float32), [0.0, 0.1], "ab"]
    ),
    waveform(np.full(10, np.nan, np.float32)),
    waveform(torch.full((10,), INF)),
    *(option("audio_sample_rate", v, audio_waveforms=[None]) for v in [0, -1, "8000", 8000.0, True]),
    option("audio_sample_rate", None, audio_waveforms=[None]),
    option("audio_sample_rate", 0),
]


class DuckLimiter:
    """Looks like a limiter, is none: the library would call methods it lacks, later, in a worker thread."""

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


#: Objects that are no anyio.CapacityLimiter, refused with a TypeError wherever a limiter is expected.
NOT_LIMITERS = [2, "budget", object(), threading.Semaphore(1), asyncio.Semaphore(1), trio.CapacityLimiter(1)]
NOT_LIMITERS += [DuckLimiter(), anyio.CapacityLimiter]
NOT_CALLABLE = [3, "print", object(), [print]]
BAD_COUNTS = [0, -1, True, False, 1.5, "4", None, 4j]  # for arguments that count: max_buffered, depth, ...
BAD_ENTRIES = [-1, True, 1.5, "0", None]


def type_name(value: object) -> str:
    return type(value).__name__


# -- options: every door, every bad value --

SYNC_DOORS = ["ChunkedVideoMP4Session", "stream_mp4", "open_latent_stream"]


def call_door(door: str, options: dict[str, Any], decoder: CountingDecoder, wan: CountedWan) -> object:
    """Call ``door`` with ``options`` over fps=8 (and a value range for the session); the two context
    managers are only called, never entered: their checks run at the call."""
    given = {"fps": 8, **options}
    if door == "ChunkedVideoMP4Session":
        return ChunkedVideoMP4Session(**{"value_range": (-1, 1), **given})
    if door == "stream_mp4":
        return stream_mp4(decoder, LATENT, **given)
    return open_latent_stream(wan.vae, **given)


@pytest.mark.parametrize("door", SYNC_DOORS)
@pytest.mark.parametrize(("options", "name"), BAD_OPTIONS)
def test_a_bad_option_value_is_a_value_error_naming_the_door_and_the_option(
    door: str, options: dict[str, Any], name: str, decoder: CountingDecoder, wan: CountedWan
) -> None:
    with pytest.raises(ValueError, match=f"^{door}: .*{name}") as caught:
        call_door(door, options, decoder, wan)
    assert not isinstance(caught.value, TypeError)
    assert (decoder.calls, wan.calls) == (0, [])


@pytest.mark.anyio
@pytest.mark.parametrize(("options", "name"), BAD_OPTIONS)
async def test_decode_to_mp4_refuses_a_bad_option_value_before_decoding(
    options: dict[str, Any], name: str, decoder: CountingDecoder
) -> None:
    with pytest.raises(ValueError, match=f"^decode_to_mp4: .*{name}") as caught:
        await decode_to_mp4(decoder, LATENT, **{"fps": 8, **options})
    assert not isinstance(caught.value, TypeError)
    assert decoder.calls == 0


@pytest.mark.parametrize(("options", "name"), BAD_OPTIONS)
def test_sessionoptions_itself_refuses_the_same_values_naming_the_option(
    options: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValueError, match=f"^{name}"):
        SessionOptions(**{"value_range": (-1, 1), "fps": 8, **options})


@pytest.mark.parametrize("door", SYNC_DOORS)
@pytest.mark.parametrize("limiter", NOT_LIMITERS, ids=type_name)
def test_an_encode_limiter_that_is_no_limiter_is_a_type_error_at_every_door(
    door: str, limiter: object, decoder: CountingDecoder, wan: CountedWan
) -> None:
    with pytest.raises(TypeError, match=f"^{door}: encode_limiter must be an anyio.CapacityLimiter"):
        call_door(door, {"encode_limiter": limiter}, decoder, wan)


@pytest.mark.parametrize("door", SYNC_DOORS)
def test_options_are_a_sessionoptions_given_alone_and_keywords_are_options(
    door: str, decoder: CountingDecoder, wan: CountedWan
) -> None:
    good = SessionOptions(value_range=(-1, 1), fps=8)
    with pytest.raises(TypeError, match=f"^{door}: options must be a streamvae.SessionOptions, got dict"):
        call_door(door, {"options": {"fps": 8}}, decoder, wan)
    with pytest.raises(TypeError, match=f"^{door}: pass the session options as options= or as keywords"):
        call_door(door, {"options": good}, decoder, wan)  # with fps=8 (and value_range) as keywords too
    with pytest.raises(
        TypeError, match=rf"^{door}\(\) got an unexpected keyword argument 'fsp'; did you mean 'fps'"
    ):
        call_door(door, {"fsp": 8}, decoder, wan)
    with pytest.raises(TypeError, match=rf"^{door}\(\) got an unexpected keyword argument 'vae_dtype'"):
        call_door(door, {"vae_dtype": torch.float16}, decoder, wan)
    assert (decoder.calls, wan.calls) == (0, [])


@pytest.mark.anyio
async def test_decode_to_mp4_takes_options_alone_and_no_unknown_keyword(decoder: CountingDecoder) -> None:
    good = SessionOptions(value_range=(-1, 1), fps=8)
    with pytest.raises(TypeError, match="^decode_to_mp4: options must be a streamvae.SessionOptions"):
        await decode_to_mp4(decoder, LATENT, options={"fps": 8})  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match="^decode_to_mp4: pass the session options as options= or as keywords"
    ):
        await decode_to_mp4(decoder, LATENT, options=good, fps=8)
    with pytest.raises(TypeError, match=r"^decode_to_mp4\(\) got an unexpected keyword argument 'fsp'"):
        await decode_to_mp4(decoder, LATENT, fsp=8)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^decode_to_mp4\(\) needs fps="):
        await decode_to_mp4(decoder, LATENT)
    assert decoder.calls == 0


# -- output files: nothing is written before the work --


@pytest.mark.parametrize(
    "paths",
    [
        pytest.param(lambda tmp: str(tmp / "a.mp4"), id="a single str"),
        pytest.param(lambda tmp: tmp / "a.mp4", id="a single Path"),
        pytest.param(lambda tmp: [3], id="an int path"),
        pytest.param(lambda tmp: [None], id="a None path"),
        pytest.param(lambda tmp: (str(p) for p in [tmp / "a.mp4"]), id="a generator"),
    ],
)
def test_a_bad_output_files_value_is_a_value_error_and_writes_nothing(
    paths: Callable[[Path], object], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="^ChunkedVideoMP4Session: output_files"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=8, output_files=paths(tmp_path))
    assert nothing_written(tmp_path)


def test_output_files_the_session_cannot_write_are_refused_leaving_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"output_files\[0\] .* and output_files\[1\] .* are the same file"):
        ChunkedVideoMP4Session(
            value_range=(-1, 1), fps=8, output_files=[tmp_path / "a.mp4", tmp_path / "a.mp4"]
        )
    with pytest.raises(IsADirectoryError):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=8, output_files=[tmp_path])
    with pytest.raises(FileNotFoundError):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=8, output_files=[tmp_path / "missing" / "a.mp4"])
    assert nothing_written(tmp_path)


@pytest.mark.anyio
async def test_decode_to_mp4_checks_the_batch_against_the_options_before_decoding(
    decoder: CountingDecoder, tmp_path: Path
) -> None:
    two = torch.zeros(2, CHANNELS, 2, 2, 2)
    with pytest.raises(
        ValueError, match="^decode_to_mp4: output_files has 1 paths but the batch has 2 entries"
    ):
        await decode_to_mp4(decoder, two, fps=8, output_files=[tmp_path / "a.mp4"])
    with pytest.raises(ValueError, match="^decode_to_mp4: audio_waveforms has 1 entries but the batch has 2"):
        await decode_to_mp4(decoder, two, fps=8, audio_waveforms=[None], audio_sample_rate=8000)
    assert decoder.calls == 0 and nothing_written(tmp_path)
    # The control: a batch that fits decodes and writes its file.
    videos = await decode_to_mp4(decoder, LATENT, fps=8, output_files=[tmp_path / "a.mp4"], **FAST)
    assert decoder.calls == 1 and (tmp_path / "a.mp4").read_bytes() == videos[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]


def test_stream_mp4_checks_the_batch_against_the_options_at_the_call(
    decoder: CountingDecoder, tmp_path: Path
) -> None:
    two = torch.zeros(2, CHANNELS, 2, 2, 2)
    with pytest.raises(ValueError, match="^stream_mp4: output_files has 3 paths but the batch has 2 entries"):
        stream_mp4(decoder, two, fps=8, output_files=[tmp_path / f"{i}.mp4" for i in range(3)])
    with pytest.raises(ValueError, match="^stream_mp4: audio_waveforms has 1 entries but the batch has 2"):
        stream_mp4(decoder, two, fps=8, audio_waveforms=[None], audio_sample_rate=8000)
    assert decoder.calls == 0 and nothing_written(tmp_path)


# -- latents: decode_to_mp4, stream_mp4, push_latents --


@pytest.mark.anyio
@pytest.mark.parametrize("target", ["a counting decoder", "a diffusers VAE"])
async def test_decode_to_mp4_refuses_a_bad_latent_before_decoding(
    target: str, decoder: CountingDecoder, wan: CountedWan
) -> None:
    vae, channels = (decoder, CHANNELS) if target == "a counting decoder" else (wan.vae, WAN_CHANNELS)
    for case in bad_latents(channels):
        z, error, match = case.values
        with pytest.raises(error, match=f"^decode_to_mp4: {match}"):
            await decode_to_mp4(vae, z, fps=8)
    assert decoder.calls == 0 and wan.calls == []  # neither decoder ran a step


@pytest.mark.parametrize(("z", "error", "match"), bad_latents(CHANNELS))
def test_stream_mp4_refuses_a_bad_latent_at_the_call(
    z: object, error: type[Exception], match: str, decoder: CountingDecoder
) -> None:
    with pytest.raises(error, match=f"^stream_mp4: {match}"):
        stream_mp4(decoder, z, fps=8)  # type: ignore[arg-type]
    assert decoder.calls == 0


@pytest.mark.anyio
@pytest.mark.parametrize(("z", "error", "match"), bad_latents(WAN_CHANNELS))
async def test_push_latents_refuses_a_bad_piece_before_decoding_and_the_stream_goes_on(
    z: object, error: type[Exception], match: str, wan: CountedWan
) -> None:
    async with open_latent_stream(wan.vae, fps=8, **FAST) as stream:
        with pytest.raises(error, match=f"^push_latents: {match}"):
            await stream.push_latents(z)  # type: ignore[arg-type]
        assert wan.calls == [] and stream.statistics().pieces_pushed == 0
        await stream.push_latents(WAN_PIECE)  # the control: a good piece after the refused one decodes
        (video,) = await stream.finish()
    assert wan.calls and read_mp4(video).frames.shape[0] == 1


@pytest.mark.anyio
async def test_push_latents_checks_the_first_piece_batch_against_the_options_before_decoding(
    wan: CountedWan, tmp_path: Path
) -> None:
    two = torch.zeros(2, WAN_CHANNELS, 1, 2, 2)
    async with open_latent_stream(wan.vae, fps=8, output_files=[tmp_path / "a.mp4"], **FAST) as stream:
        with pytest.raises(ValueError, match="^push_latents: output_files has 1 paths but the batch has 2"):
            await stream.push_latents(two)
        assert wan.calls == [] and nothing_written(tmp_path)
        await stream.push_latents(WAN_PIECE)  # the control: a batch that fits
        (video,) = await stream.finish()
    assert (tmp_path / "a.mp4").read_bytes() == video
    async with open_latent_stream(wan.vae, fps=8, audio_waveforms=[None], audio_sample_rate=8000) as stream:
        with pytest.raises(
            ValueError, match="^push_latents: audio_waveforms has 1 entries but the batch has 2"
        ):
            await stream.push_latents(two)
    async with open_latent_stream(wan.vae, fps=8) as stream:
        stream.open_stream(1)
        with pytest.raises(
            ValueError, match=r"^push_latents: open_stream\(\) was called for entry 1, but the batch"
        ):
            await stream.push_latents(WAN_PIECE)
    assert wan.calls == [1]  # the one good piece only


# -- VAEs --

TINY_HUNYUAN_VIDEO = {
    "latent_channels": 4,
    "block_out_channels": (8,) * 4,
    "layers_per_block": 1,
    "norm_num_groups": 4,
}
NOT_VAES = [None, "wan", 3, object(), torch.nn.Linear(2, 2), AutoencoderKLWan, torch.zeros(1)]


@pytest.mark.anyio
@pytest.mark.parametrize("vae", NOT_VAES, ids=type_name)
async def test_decode_to_mp4_refuses_what_is_no_vae_naming_itself(vae: object) -> None:
    with pytest.raises(
        TypeError,
        match=f"^decode_to_mp4: vae must be a supported diffusers VAE or a .*got .*{type(vae).__qualname__}",
    ):
        await decode_to_mp4(vae, LATENT, fps=8)


@pytest.mark.parametrize("vae", NOT_VAES, ids=type_name)
def test_stream_mp4_and_as_decoder_refuse_what_is_no_vae_naming_themselves(vae: object) -> None:
    with pytest.raises(TypeError, match=f"^stream_mp4: vae must be .*{type(vae).__qualname__}"):
        stream_mp4(vae, LATENT, fps=8)
    with pytest.raises(
        TypeError, match="^as_decoder: vae must be a supported diffusers VAE or a streamvae.Supports"
    ):
        as_decoder(vae)


@pytest.mark.parametrize("vae", [*NOT_VAES, CountingDecoder()], ids=type_name)
def test_chunked_decoder_refuses_what_is_no_diffusers_vae_offering_only_what_it_takes(vae: object) -> None:
    with pytest.raises(
        TypeError, match="^chunked_decoder: vae must be a supported diffusers VAE, got"
    ) as caught:
        chunked_decoder(vae)
    assert "SupportsChunkedVAEDecode" not in str(caught.value)  # it takes none: only diffusers VAEs


@pytest.mark.parametrize(
    "make",
    [
        *(pytest.param(lambda vae=vae: vae, id=type_name(vae)) for vae in NOT_VAES),
        pytest.param(CountingDecoder, id="a protocol-only decoder"),
        pytest.param(lambda: AutoencoderKLHunyuanVideo(**TINY_HUNYUAN_VIDEO), id="AutoencoderKLHunyuanVideo"),
    ],
)
def test_open_latent_stream_refuses_a_vae_that_cannot_take_pieces_listing_only_those_that_can(
    make: Callable[[], object],
) -> None:
    with pytest.raises(TypeError, match="^open_latent_stream: ") as caught:
        open_latent_stream(make(), fps=8)
    message = str(caught.value)
    assert "AutoencoderKLWan, AutoencoderKLQwenImage" in message
    for other in ("CogVideoX", "LTX", "AutoencoderKLHunyuanVideo", "SupportsChunkedVAEDecode"):
        assert other not in message, other


def test_decode_keywords_a_diffusers_adapter_does_not_take_are_refused_naming_the_call(
    wan: CountedWan,
) -> None:
    for door, call in (("as_decoder", as_decoder), ("chunked_decoder", chunked_decoder)):
        with pytest.raises(
            TypeError, match=f"^{door}: got an unexpected keyword argument 'temb' .*WanChunkedDecoder"
        ):
            call(wan.vae, temb=torch.zeros(1))
    with pytest.raises(TypeError, match="^as_decoder: temb apply only to a diffusers VAE"):
        as_decoder(CountingDecoder(), temb=torch.zeros(1))
    assert chunked_decoder(wan.vae).vae is wan.vae and as_decoder(wan.vae, drain=True).drain  # the controls
    assert wan.calls == []


# -- limiters, callbacks and counts --


@pytest.mark.anyio
@pytest.mark.parametrize("limiter", NOT_LIMITERS, ids=type_name)
async def test_a_decode_limiter_that_is_no_limiter_is_a_type_error_before_any_decode(
    limiter: object, decoder: CountingDecoder, wan: CountedWan
) -> None:
    expected = "decode_limiter must be an anyio.CapacityLimiter or None, got"
    with pytest.raises(TypeError, match=f"^decode_to_mp4: {expected}"):
        await decode_to_mp4(decoder, LATENT, fps=8, decode_limiter=limiter)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=f"^stream_mp4: {expected}"):
        stream_mp4(decoder, LATENT, fps=8, decode_limiter=limiter)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=f"^open_latent_stream: {expected}"):
        open_latent_stream(wan.vae, fps=8, decode_limiter=limiter)  # type: ignore[arg-type]
    assert (decoder.calls, wan.calls) == (0, [])


@pytest.mark.anyio
@pytest.mark.parametrize("on_session", NOT_CALLABLE, ids=type_name)
async def test_an_on_session_that_is_not_callable_is_a_type_error_before_any_decode(
    on_session: object, decoder: CountingDecoder
) -> None:
    with pytest.raises(TypeError, match="^decode_to_mp4: on_session must be a callable or None"):
        await decode_to_mp4(decoder, LATENT, fps=8, on_session=on_session)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^stream_mp4: on_session must be a callable or None"):
        stream_mp4(decoder, LATENT, fps=8, on_session=on_session)  # type: ignore[arg-type]
    assert decoder.calls == 0


@pytest.mark.parametrize("max_buffered", BAD_COUNTS, ids=repr)
def test_a_bad_max_buffered_is_a_value_error_at_the_call(
    max_buffered: object, decoder: CountingDecoder
) -> None:
    with pytest.raises(ValueError, match="^stream_mp4: max_buffered must be an int >= 1"):
        stream_mp4(decoder, LATENT, fps=8, max_buffered=max_buffered)  # type: ignore[arg-type]
    session = ChunkedVideoMP4Session(value_range=(-1, 1), fps=8)
    with pytest.raises(ValueError, match="^open_stream: max_buffered must be an int >= 1"):
        session.open_stream(0, max_buffered=max_buffered)  # type: ignore[arg-type]
    assert decoder.calls == 0


@pytest.mark.parametrize("entry", BAD_ENTRIES, ids=repr)
def test_a_bad_entry_is_a_value_error_when_open_stream_is_called(entry: object) -> None:
    session = ChunkedVideoMP4Session(value_range=(-1, 1), fps=8)
    with pytest.raises(ValueError, match="^open_stream: entry must be an int >= 0"):
        session.open_stream(entry)  # type: ignore[arg-type]
    session.open_stream(0)  # the control: a good entry after the refused one


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("entry", "max_buffered"), [*((e, 4) for e in BAD_ENTRIES), *((0, m) for m in BAD_COUNTS)]
)
async def test_a_latent_streams_open_stream_refuses_bad_arguments(
    entry: object, max_buffered: object, wan: CountedWan
) -> None:
    async with open_latent_stream(wan.vae, fps=8) as stream:
        with pytest.raises(ValueError, match="^open_stream: (entry|max_buffered) must be an int"):
            stream.open_stream(entry, max_buffered=max_buffered)  # type: ignore[arg-type]
    assert wan.calls == []


def test_stream_mp4_on_a_rank_without_the_output_is_refused_at_the_call() -> None:
    decoder = CountingDecoder(is_output_rank=False)
    with pytest.raises(ValueError, match=r"^stream_mp4\(\) on a rank that does not own the output"):
        stream_mp4(decoder, LATENT, fps=8)
    assert decoder.calls == 0


# -- chunks: push, push_from_thread, quantize --


@pytest.mark.anyio
@pytest.mark.parametrize("way", ["push", "push_from_thread"])
@pytest.mark.parametrize(("chunk", "error", "match"), bad_chunks())
async def test_push_refuses_a_bad_chunk_before_any_work_naming_itself(
    way: str, chunk: object, error: type[Exception], match: str
) -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=8, **FAST) as session:

        async def push(pushed: object) -> None:
            if way == "push":
                await session.push(pushed)  # type: ignore[arg-type]
            else:
                await anyio.to_thread.run_sync(session.push_from_thread, pushed)

        with pytest.raises(error, match=f"^{way}: {match}"):
            await push(chunk)
        assert session.frames_pushed == 0 and session.pixel_format is None  # no pipeline was built
        await push(CHUNK)  # the control
        (video,) = await session.finish()
    assert read_mp4(video).frames.shape[0] == 1


@pytest.mark.anyio
async def test_push_checks_the_first_chunk_batch_against_the_options_before_any_work(tmp_path: Path) -> None:
    two = torch.zeros(2, 3, 1, 16, 16)
    async with ChunkedVideoMP4Session(
        value_range=(-1, 1), fps=8, output_files=[tmp_path / "a.mp4"]
    ) as session:
        with pytest.raises(ValueError, match="^push: output_files has 1 paths but the batch has 2 entries"):
            await session.push(two)
        assert session.pixel_format is None and nothing_written(tmp_path)
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=8) as session:
        session.open_stream(2)
        with pytest.raises(
            ValueError, match=r"^push: open_stream\(\) was called for entry 2, but the batch size is 2"
        ):
            await session.push(two)
        assert session.pixel_format is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("options", "chunk", "match"),
    [
        ({"crop": (32, 32)}, CHUNK, "crop"),
        ({}, torch.zeros(1, 3, 1, 15, 16), "even height and width"),
    ],
    ids=["crop larger than the frames", "odd height"],
)
async def test_a_frame_size_the_options_cannot_take_is_refused_naming_push(
    options: dict[str, Any], chunk: Tensor, match: str
) -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=8, **options) as session:
        with pytest.raises(ValueError, match=f"^push: .*{match}"):
            await session.push(chunk)


@pytest.mark.parametrize("quantize", [quantize_chunk, quantize_chunk_yuv420], ids=lambda f: f.__name__)
@pytest.mark.parametrize(("chunk", "error", "match"), bad_chunks())
def test_quantize_refuses_a_bad_chunk_naming_itself(
    quantize: Callable[..., Tensor], chunk: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=f"^{quantize.__name__}: {match}"):
        quantize(chunk, (-1, 1))


@pytest.mark.parametrize("quantize", [quantize_chunk, quantize_chunk_yuv420], ids=lambda f: f.__name__)
@pytest.mark.parametrize("value_range", BAD_VALUE_RANGES, ids=repr)
def test_quantize_refuses_a_bad_value_range_naming_itself(
    quantize: Callable[..., Tensor], value_range: object
) -> None:
    with pytest.raises(ValueError, match=f"^{quantize.__name__}: value_range"):
        quantize(CHUNK, value_range)


@pytest.mark.parametrize("size", [(15, 16), (16, 15), (1, 1)])
def test_quantize_yuv420_refuses_an_odd_frame_size_naming_itself(size: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="^quantize_chunk_yuv420: .*even height and width"):
        quantize_chunk_yuv420(torch.zeros(1, 3, 1, *size), (-1, 1))
    assert quantize_chunk(torch.zeros(1, 3, 1, *size), (-1, 1)).shape == (1, 1, *size, 3)  # rgb24 takes it


@pytest.mark.parametrize(
    "value_range",
    [
        (-1, 1),
        [0.0, 1.0],
        (np.float32(-1), np.float32(1)),
        (torch.tensor(-1.0), torch.tensor(1.0)),
        (Fraction(0), 1),
    ],
    ids=repr,
)
def test_a_value_range_of_any_kind_of_number_is_taken(value_range: Any) -> None:
    low, high = (float(v) for v in value_range)
    out = quantize_chunk(torch.full((1, 3, 1, 2, 2), high), value_range)
    assert out.unique().tolist() == [255]
    assert SessionOptions(value_range=value_range, fps=8).value_range == (low, high)


# -- the transfer ring --


@pytest.mark.parametrize("depth", BAD_COUNTS, ids=repr)
def test_a_ring_of_a_bad_depth_is_a_value_error_naming_the_ring(depth: object) -> None:
    with pytest.raises(ValueError, match="^PinnedChunkRing: depth must be an int >= 1"):
        PinnedChunkRing(depth)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "device",
    ["gpu", "", None, 3, True, "meta", object(), "cuda:99"],
    ids=lambda device: "object()" if type(device) is object else repr(device),  # the same id in every worker
)
def test_a_ring_on_a_device_it_cannot_copy_from_is_a_value_error_naming_the_ring(device: object) -> None:
    with pytest.raises(ValueError, match="^PinnedChunkRing: device"):
        PinnedChunkRing(2, device)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"frames": [0, 1]}, TypeError, "frames must be a torch.Tensor"),
        ({"frames": np.zeros(4, np.uint8)}, TypeError, "frames must be a torch.Tensor"),
        ({"frames": torch.zeros(4)}, ValueError, "frames must be a contiguous uint8"),
        (
            {"frames": torch.zeros(4, 4, dtype=torch.uint8).t()},
            ValueError,
            "frames must be a contiguous uint8",
        ),
        ({"extra": 3}, TypeError, "extra must be a torch.Tensor"),
        *(({"readers": readers}, ValueError, "readers must be an int >= 1") for readers in BAD_COUNTS),
    ],
    ids=repr,
)
async def test_a_ring_transfer_refuses_bad_arguments_before_taking_a_slot(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    ring = PinnedChunkRing(1, "cpu")
    given = {"frames": torch.arange(4, dtype=torch.uint8), "readers": 1, **kwargs}
    with pytest.raises(error, match=f"^PinnedChunkRing.transfer: {match}"):
        await ring.transfer(**given)
    assert ring.slots_in_use == 0 and ring.stats().transfers == 0
    lease = await ring.transfer(torch.arange(4, dtype=torch.uint8), readers=1)  # the control
    assert (await lease.wait_landed()).tolist() == [0, 1, 2, 3]
    lease.release()
    assert ring.slots_in_use == 0


def test_a_ring_takes_a_device_name_or_a_torch_device() -> None:
    assert PinnedChunkRing(2).device == PinnedChunkRing(1, torch.device("cpu")).device == torch.device("cpu")


# -- the controls: good arguments pass every door --


@pytest.mark.anyio
async def test_good_arguments_open_every_door(
    decoder: CountingDecoder, wan: CountedWan, tmp_path: Path
) -> None:
    limiter = anyio.CapacityLimiter(1)
    options: dict[str, Any] = {
        "fps": Fraction(30000, 1001),
        "batch_frames": 2,
        "crop": (16, 16),
        "transfer_slots": 0,
        "audio_waveforms": [torch.zeros(800)],
        "audio_sample_rate": 8000,
        "encode_limiter": anyio.CapacityLimiter(2),
        **FAST,
    }
    sessions: list[ChunkedVideoMP4Session] = []
    (mp4,) = await decode_to_mp4(
        decoder, LATENT.double(), decode_limiter=limiter, on_session=sessions.append, **options
    )
    assert decoder.calls == 1 and len(sessions) == 1 and read_mp4(mp4).frames.shape[0] == 2
    async with stream_mp4(decoder, LATENT, decode_limiter=limiter, max_buffered=1, **options) as (stream,):
        data = b"".join([piece async for piece in stream])
    assert decoder.calls == 2 and read_mp4(data).frames.shape[0] == 2
    (mp4,) = await decode_to_mp4(
        wan.vae, WAN_PIECE.double(), fps=8, output_files=[tmp_path / "w.mp4"], **FAST
    )
    assert wan.calls == [1] and (tmp_path / "w.mp4").read_bytes() == mp4
    async with open_latent_stream(
        wan.vae, decode_limiter=limiter, options=SessionOptions(value_range=(-1, 1), fps=8)
    ) as latents:
        await latents.push_latents(WAN_PIECE)
        await latents.push_latents(WAN_PIECE.half())  # any float dtype: the decoder casts it
        (mp4,) = await latents.finish()
    assert wan.calls == [1, 1, 1] and read_mp4(mp4).frames.shape[0] == 5
