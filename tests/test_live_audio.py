"""A live audio track: samples pushed as they are made, encoded as the video is, one AAC stream that ends
with the video. Checked by PyAV decoding the MP4 (the whole of it, and every prefix a client may hold)
against the pushed sound and against the same sound given whole up front."""

from __future__ import annotations

import io
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import anyio
import av
import numpy as np
import pytest
import torch

from streamvae import ChunkedVideoMP4Session, MP4Piece, SessionClosedError, SessionOptions, open_latent_stream
from streamvae._encode import EntryEncoder
from streamvae._live_audio import LiveAudioTrack
from tests._media import DETERMINISTIC_X264, count_frames, moving_pattern, read_mp4
from tests._vaes import latent, tiny_wan21

pytestmark = pytest.mark.anyio

HANG_GUARD = 60  # seconds: turns a hang into a failure, never a speed check
FPS, RATE = 16, 48000
PER_FRAME = RATE // FPS  # 3000 samples a video frame
GROUPS = [1, 4, 4, 4, 4, 4, 4]  # 25 frames, as a causal VAE publishes them
FRAMES = sum(GROUPS)
LIVE: dict[str, Any] = {
    "value_range": (-1, 1),
    "fps": FPS,
    "audio_sample_rate": RATE,
    "audio_channels": 1,
    "output": "fragmented",
    "video_codec_options": DETERMINISTIC_X264,
}


def sine(samples: int, hertz: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hertz * np.arange(samples) / RATE)).astype(np.float32)


def uneven_cuts(start: int, end: int, seed: int) -> list[tuple[int, int]]:
    """[start, end) cut into pieces of 100 to 5000 samples, none on a frame or AAC-frame boundary."""
    rng, cuts = np.random.default_rng(seed), []
    while start < end:
        size = min(end - start, int(rng.integers(100, 5000)))
        cuts.append((start, start + size))
        start += size
    return cuts


def decoded(data: bytes) -> tuple[int, np.ndarray]:
    """(video frames, audio samples [channels, n]) PyAV decodes from ``data``."""
    frames = count_frames(data)
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            return frames, np.zeros((1, 0), np.float32)
        audio = [frame.to_ndarray() for frame in container.decode(audio=0)]
    return frames, np.concatenate(audio, axis=1) if audio else np.zeros((1, 0), np.float32)


async def live_session(
    sound: np.ndarray,
    *,
    groups: Sequence[int] = GROUPS,
    seed: int = 0,
    ahead: bool = False,
    behind: bool = False,
    **options: Any,
) -> tuple[list[MP4Piece], list[int]]:
    """Push each group's sound (``[channels, samples]``) in uneven pieces, then its frames (``ahead``: all
    of the sound before the first chunk; ``behind``: each group's sound after its frames); return entry
    0's pieces and where the pushes were cut."""
    pieces: list[MP4Piece] = []
    cuts: list[int] = []
    total = sound.shape[1]
    with anyio.fail_after(HANG_GUARD):
        async with ChunkedVideoMP4Session(**{**LIVE, **options}) as session:
            stream = session.open_stream(0, max_buffered=1000)

            async def produce() -> None:
                start = pushed = 0
                for size in groups:
                    if behind:
                        await session.push(moving_pattern(start, size, height=32, width=32))
                    until = total if ahead else min(total, (start + size) * RATE // FPS)
                    for begin, end in uneven_cuts(pushed, until, seed + start):
                        session.push_audio(
                            sound[:, begin:end].squeeze(0) if sound.shape[0] == 1 else sound[:, begin:end]
                        )
                        cuts.append(end)
                    pushed = max(pushed, until)
                    if not behind:
                        await session.push(moving_pattern(start, size, height=32, width=32))
                    start += size
                if pushed < total:
                    session.push_audio(sound[:, pushed:])
                await session.finish()

            session.start_producer(produce)
            async for piece in stream.pieces():
                pieces.append(piece)
    return pieces, cuts


def joined(pieces: Sequence[MP4Piece]) -> bytes:
    return b"".join(piece.data for piece in pieces)


async def whole_waveform_mp4(sound: np.ndarray, **options: Any) -> bytes:
    """The same frames with the same sound given up front (``audio_waveforms``): the reference encode."""
    given = {**LIVE, **options, "audio_waveforms": [sound], "audio_channels": None}
    async with ChunkedVideoMP4Session(**given) as session:
        start = 0
        for size in GROUPS:
            await session.push(moving_pattern(start, size, height=32, width=32))
            start += size
        (video,) = await session.finish()
    return video


# -- the sound --


async def test_a_sine_pushed_in_uneven_pieces_decodes_to_that_sine_as_one_stream() -> None:
    sound = sine(FRAMES * PER_FRAME)[None]
    pieces, cuts = await live_session(sound)
    frames, audio = decoded(joined(pieces))
    assert frames == FRAMES
    # One AAC stream over the pushes: what decodes is what the same sound given whole decodes to, bit for bit.
    _, reference = decoded(await whole_waveform_mp4(sound))
    np.testing.assert_array_equal(audio, reference)
    # PyAV drops AAC's priming (the moov's edit list): sample i is the pushed sample i.
    shown = audio[0, : sound.shape[1]]
    assert np.corrcoef(shown, sound[0, : shown.size])[0, 1] > 0.99
    error = np.abs(shown - sound[0, : shown.size])
    near = np.zeros(error.size, bool)
    for cut in cuts[:-1]:
        near[max(0, cut - 256) : cut + 256] = True
    assert error[near].max() <= error[~near].max()  # no click where pushes meet
    # the track ends with the video: within one frame (AAC ends on whole frames of 1024 samples)
    assert abs(audio.shape[1] - FRAMES * PER_FRAME) <= PER_FRAME
    mp4 = read_mp4(joined(pieces))
    assert mp4.audio_duration == pytest.approx(FRAMES / FPS, abs=1 / FPS)


async def test_at_every_fragment_the_audio_is_within_one_frame_of_the_video() -> None:
    pieces, _ = await live_session(sine(FRAMES * PER_FRAME)[None], seed=1)
    for end in range(1, len(pieces) + 1):
        frames, audio = decoded(joined(pieces[:end]))
        assert frames == pieces[end - 1].frames_until
        assert abs(audio.shape[1] - frames * PER_FRAME) <= PER_FRAME, f"after piece {end}"


async def test_a_latent_streams_audio_pushed_before_each_piece_stays_with_its_frames() -> None:
    vae = tiny_wan21()
    z = latent(vae, frames=5, h=4, w=4)
    sound = sine(17 * PER_FRAME)  # 1 + 4 × 4 frames
    pieces: list[MP4Piece] = []
    with anyio.fail_after(HANG_GUARD):
        async with open_latent_stream(vae, **{**LIVE, "value_range": (-1, 1)}) as stream:
            video = stream.open_stream(0, max_buffered=1000)

            async def produce() -> None:
                start = 0
                for index in range(z.shape[2]):
                    end = 1 if index == 0 else start + 4
                    stream.push_audio(torch.from_numpy(sound[start * PER_FRAME : end * PER_FRAME]))
                    await stream.push_latents(z[:, :, index : index + 1])
                    start = end
                await stream.finish()
                with pytest.raises(
                    SessionClosedError, match="push_audio\\(\\) on a latent stream that is finished"
                ):
                    stream.push_audio(sound[:10])

            stream.session.start_producer(produce)
            async for piece in video.pieces():
                pieces.append(piece)
    assert pieces[-1].frames_until == 17
    for end in range(1, len(pieces) + 1):
        frames, audio = decoded(joined(pieces[:end]))
        assert abs(audio.shape[1] - frames * PER_FRAME) <= PER_FRAME


async def test_audio_pushed_before_the_first_chunk_waits_for_the_encoder() -> None:
    sound = sine(FRAMES * PER_FRAME)[None]
    pieces, _ = await live_session(sound, ahead=True)
    _, audio = decoded(joined(pieces))
    _, reference = decoded(await whole_waveform_mp4(sound))
    np.testing.assert_array_equal(audio, reference)


async def test_a_track_that_lags_the_video_catches_up_in_the_same_stream() -> None:
    sound = sine(FRAMES * PER_FRAME)[None]
    pieces, _ = await live_session(sound, behind=True)
    frames, audio = decoded(joined(pieces))
    _, reference = decoded(await whole_waveform_mp4(sound))
    assert frames == FRAMES
    np.testing.assert_array_equal(audio, reference)


async def test_stereo_keeps_each_channel() -> None:
    sound = np.stack([sine(FRAMES * PER_FRAME, 440), sine(FRAMES * PER_FRAME, 660)])
    pieces, _ = await live_session(sound, audio_channels=2)
    mp4 = read_mp4(joined(pieces))
    assert mp4.audio_channels == 2
    _, audio = decoded(joined(pieces))
    for channel in range(2):
        shown = audio[channel, : sound.shape[1]]
        assert np.corrcoef(shown, sound[channel, : shown.size])[0, 1] > 0.99
    assert np.corrcoef(audio[0, : sound.shape[1]], sound[1, : sound.shape[1]])[0, 1] < 0.5


async def test_a_plain_mp4_takes_a_live_track_too() -> None:
    sound = sine(FRAMES * PER_FRAME)[None]
    [piece], _ = await live_session(sound, output="mp4")
    frames, audio = decoded(piece.data)
    assert frames == piece.frames == FRAMES
    _, reference = decoded(await whole_waveform_mp4(sound, output="mp4"))
    np.testing.assert_array_equal(audio, reference)


# -- the end: padded or trimmed within a frame, an error beyond --


@pytest.mark.parametrize("off", [-PER_FRAME // 2, -PER_FRAME, PER_FRAME // 2, PER_FRAME])
async def test_a_track_within_one_frame_of_the_video_is_padded_or_trimmed_to_it(off: int) -> None:
    sound = sine(FRAMES * PER_FRAME + off)[None]
    pieces, _ = await live_session(sound)
    _, audio = decoded(joined(pieces))
    # the encoded track is the video's duration: what the exact-length sound (padded with silence) gives
    exact = np.zeros((1, FRAMES * PER_FRAME), np.float32)
    exact[:, : min(sound.shape[1], exact.shape[1])] = sound[:, : exact.shape[1]]
    _, reference = decoded(await whole_waveform_mp4(exact))
    np.testing.assert_array_equal(audio, reference)


@pytest.mark.parametrize(("off", "lasts"), [(-PER_FRAME - 1, "1.500"), (PER_FRAME + 1, "1.625")])
async def test_a_track_further_off_fails_the_session_saying_both_durations(off: int, lasts: str) -> None:
    sound = sine(FRAMES * PER_FRAME + off)[None]
    with pytest.raises(ValueError, match=f"entry 0's {lasts}") as raised:
        await live_session(sound)
    message = str(raised.value)
    assert message.startswith("finish: the live audio does not last as long as the video")
    assert "the video lasts 1.562 s (25 frames at 16 fps)" in message


async def test_a_track_never_pushed_is_too_short() -> None:
    with pytest.raises(ValueError, match=r"entry 1's 0\.000 s \(0 samples\)"):
        async with ChunkedVideoMP4Session(**{**LIVE, "output": "mp4"}) as session:
            session.push_audio(sine(4 * PER_FRAME), entry=0)
            await session.push(moving_pattern(0, 4, batch=2, height=32, width=32))
            await session.finish()


# -- memory --


def live_encoder(track: LiveAudioTrack, **options: Any) -> EntryEncoder:
    """An encoder of FPS frames a second whose sound is ``track``, at RATE."""
    return EntryEncoder(fps=Fraction(FPS), audio_sample_rate=RATE, live_audio=track, **options)


def test_the_encoder_drops_what_it_encoded_and_never_runs_ahead_of_the_video() -> None:
    track = LiveAudioTrack(1)
    encoder = live_encoder(track, output="fragmented", video_codec_options=DETERMINISTIC_X264)
    frames = np.zeros((1, 32, 32, 3), np.uint8)
    try:
        for index in range(64):
            track.append(sine(2 * PER_FRAME)[None])  # twice what the frame needs: the audio runs ahead
            encoder.encode(frames)
            assert track.pushed - track.buffered == (index + 1) * PER_FRAME  # encoded up to the video
        encoder.close()
        fresh = LiveAudioTrack(1)
        encoder = live_encoder(fresh)
        for _ in range(64):
            fresh.append(sine(PER_FRAME)[None])
            encoder.encode(frames)
            assert fresh.buffered == 0  # what is encoded is no longer held: flat memory
    finally:
        encoder.close()


# -- the door --


async def test_push_audio_checks_its_arguments() -> None:
    async with ChunkedVideoMP4Session(**{**LIVE, "output": "mp4"}) as session:
        bad: list[tuple[Any, dict[str, Any], str]] = [
            (
                np.zeros((2, 10), np.float32),
                {},
                "waveform has 2 channels but the session's live audio has audio_channels=1",
            ),
            (np.zeros((3, 10), np.float32), {}, "push_audio: waveform must be 1-D"),
            (np.array([0.0, np.nan], np.float32), {}, "push_audio: waveform must be finite"),
            (np.array([0.0, np.inf], np.float32), {}, "push_audio: waveform must be finite"),
            (np.zeros(10, np.int16), {}, "push_audio: waveform must be a float array"),
            ([0.0, 0.1], {}, "push_audio: waveform must be a float array"),
            (np.zeros(10, np.float32), {"entry": -1}, "push_audio: entry must be an int >= 0"),
            (np.zeros(10, np.float32), {"entry": 1.0}, "push_audio: entry must be an int >= 0"),
        ]
        for waveform, keywords, message in bad:
            with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
                session.push_audio(waveform, **keywords)
        session.push_audio(np.zeros(10, np.float32), entry=1)  # the batch is not known yet
        with pytest.raises(
            ValueError, match="push: push_audio\\(\\) was given entry 1, but the batch size is 1"
        ):
            await session.push(moving_pattern(0, 1, height=32, width=32))
        await session.push(moving_pattern(0, 1, batch=2, height=32, width=32))
        with pytest.raises(ValueError, match="push_audio: entry 2 is not in the batch of 2 entries"):
            session.push_audio(np.zeros(10, np.float32), entry=2)
        session.abort()


async def test_push_audio_takes_tensors_on_any_device_from_any_thread() -> None:
    sound = sine(FRAMES * PER_FRAME)
    async with ChunkedVideoMP4Session(**{**LIVE, "output": "mp4"}) as session:
        half = sound.size // 2
        await anyio.to_thread.run_sync(session.push_audio, torch.from_numpy(sound[:half]).double())
        buffer = sound[half:].copy()
        session.push_audio(buffer[None])
        buffer[:] = 0  # the session copied it
        start = 0
        for size in GROUPS:
            await session.push(moving_pattern(start, size, height=32, width=32))
            start += size
        (video,) = await session.finish()
    _, audio = decoded(video)
    _, reference = decoded(await whole_waveform_mp4(sound[None], output="mp4"))
    np.testing.assert_array_equal(audio, reference)


async def test_push_audio_without_a_live_track_says_how_to_get_one() -> None:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=FPS) as session:
        with pytest.raises(
            ValueError, match="push_audio: this session has no live audio track; pass audio_channels"
        ):
            session.push_audio(np.zeros(10, np.float32))
        session.abort()


async def test_push_audio_after_finish_or_abort_is_a_closed_session() -> None:
    async with ChunkedVideoMP4Session(**{**LIVE, "output": "mp4"}) as session:
        session.push_audio(sine(PER_FRAME))
        await session.push(moving_pattern(0, 1, height=32, width=32))
        await session.finish()
        with pytest.raises(SessionClosedError, match="push_audio\\(\\) on a session that is done"):
            session.push_audio(np.zeros(10, np.float32))
    with pytest.raises(SessionClosedError, match="push_audio\\(\\) on a session that is closed"):
        session.push_audio(np.zeros(10, np.float32))
    async with ChunkedVideoMP4Session(**{**LIVE, "output": "mp4"}) as aborted:
        aborted.abort()
        with pytest.raises(SessionClosedError, match="push_audio\\(\\) on a session that is aborted"):
            aborted.push_audio(np.zeros(10, np.float32))


async def test_push_audio_after_a_failure_raises_the_failure() -> None:
    error = OSError("the generator's disk is full")
    async with ChunkedVideoMP4Session(**{**LIVE, "output": "mp4"}) as session:
        session.fail(error)
        with pytest.raises(OSError) as raised:
            session.push_audio(np.zeros(10, np.float32))
    assert raised.value is error


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"audio_channels": 3}, r"audio_channels must be 1 \(mono\) or 2 \(stereo\), got 3"),
        ({"audio_channels": 0}, r"audio_channels must be 1 \(mono\) or 2 \(stereo\), got 0"),
        ({"audio_channels": True}, r"audio_channels must be 1 \(mono\) or 2 \(stereo\), got True"),
        ({"audio_channels": 1.0}, r"audio_channels must be 1 \(mono\) or 2 \(stereo\), got 1.0"),
        ({"audio_channels": "1"}, r"audio_channels must be 1 \(mono\) or 2 \(stereo\), got '1'"),
        (
            {"audio_channels": 1, "audio_sample_rate": None},
            "audio_sample_rate must be an int from 1000 to 768000 Hz when audio_channels",
        ),
        (
            {"audio_channels": 1, "audio_sample_rate": 0},
            "audio_sample_rate must be an int from 1000 to 768000",
        ),
        (
            {"audio_channels": 1, "audio_waveforms": [np.zeros(10, np.float32)]},
            "audio_channels and audio_waveforms exclude each other",
        ),
    ],
)
def test_the_live_track_options_are_checked_at_the_door(options: dict[str, Any], message: str) -> None:
    given = {"value_range": (-1, 1), "fps": FPS, "audio_sample_rate": RATE, **options}
    with pytest.raises(ValueError, match=message):
        SessionOptions(**given)
    with pytest.raises(ValueError, match=f"ChunkedVideoMP4Session: {message}"):
        ChunkedVideoMP4Session(**given)


@pytest.mark.anyio
async def test_a_call_that_cannot_feed_a_live_track_refuses_it_before_any_work() -> None:
    from streamvae import decode_to_mp4, stream_mp4
    from streamvae.demo import demo_latent, demo_vae
    from streamvae.pipelines import generate_mp4
    from tests.pipelines.wan import wan21

    vae, z = demo_vae(), demo_latent(5, 16)
    live = {"audio_channels": 1, "audio_sample_rate": 48_000}
    with pytest.raises(ValueError, match=r"^decode_to_mp4: audio_channels is a live audio track, fed by"):
        await decode_to_mp4(vae, z, fps=16, **live)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^stream_mp4: audio_channels is a live audio track"):
        stream_mp4(vae, z, fps=16, **live)  # type: ignore[arg-type]
    pipe, make_kwargs = wan21()
    with pytest.raises(ValueError, match=r"^generate_mp4: session_options: audio_channels is a live"):
        await generate_mp4(pipe, fps=8, session_options=live, **make_kwargs())

    # With on_session the caller reaches push_audio: the whole sound, pushed before the decode.
    def push(session: Any) -> None:
        session.push_audio(np.zeros((1, 48_000 * 5 // 16), np.float32))

    (video,) = await decode_to_mp4(vae, z, fps=16, on_session=push, **live)  # type: ignore[arg-type]
    assert read_mp4(video).audio_duration == pytest.approx(5 / 16, abs=1 / 16)
