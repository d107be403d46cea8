"""The edges a newcomer and an adversarial probe hit (issue 37): each argument refused at the door that
takes it, before any work; a refusal that names what was wrong; one answer to each WebSocket interaction,
whatever the generator's check raises; a stand-in that no client message kills; a CLI that keeps its
one-line promise on a bad port, a seed out of range and a SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from streamvae import SessionOptions
from streamvae.cli import build_parser, main
from streamvae.demo import demo_latent
from streamvae.pipelines import generate_mp4, stream_generation
from streamvae.server import Interactions, RealtimePiece, create_app, realtime_video_endpoint
from tests._cli import check_signal_mid_decode, one_line_error
from tests._media import DETERMINISTIC_X264, read_mp4
from tests._server import EventLog, get_once
from tests._websocket import Client, Pieces, check_pieces, connect
from tests.pipelines import CORE as BUILDERS

pytestmark = pytest.mark.anyio

PINNED = {"video_codec_options": DETERMINISTIC_X264}


def interaction(event_id: str, event: object) -> dict[str, Any]:
    return {"type": "session.interaction", "interaction": {"event_id": event_id, "event": event}}


async def next_message(client: Client) -> dict[str, Any]:
    """The next message that is not a piece (the pieces' metadata and bytes are read past)."""
    while (message := await client.receive_json())["type"] == "video.chunk_metadata":
        await client.receive_bytes()
    return message


# -- generate_mp4: the batch checked before the first step --


@pytest.mark.parametrize("entry", ["generate_mp4", "stream_generation"])
@pytest.mark.parametrize(
    ("embeddings", "per_prompt", "files", "batch"),
    [(1, None, 2, 1), (1, 2, 1, 2), (2, 2, 2, 4)],  # the batch: prompt_embeds' × num_videos_per_prompt
)
async def test_output_files_for_another_batch_are_refused_before_the_first_step(
    entry: str, embeddings: int, per_prompt: int | None, files: int, batch: int, tmp_path: Path
) -> None:
    pipe, make_kwargs = BUILDERS["wan21"]()
    kwargs = make_kwargs()
    for name in ("prompt_embeds", "negative_prompt_embeds"):
        kwargs[name] = kwargs[name].repeat(embeddings, 1, 1)
    if per_prompt is not None:
        kwargs["num_videos_per_prompt"] = per_prompt
    forwards: list[int] = []
    hook = pipe.transformer.register_forward_pre_hook(lambda module, args: forwards.append(1))
    options = {**PINNED, "output_files": [tmp_path / f"{n}.mp4" for n in range(files)]}
    message = f"^{entry}: output_files has {files} paths but the batch has {batch} entries$"
    try:
        with pytest.raises(ValueError, match=message):
            if entry == "generate_mp4":
                await generate_mp4(pipe, fps=8, session_options=options, **kwargs)
            else:
                async with stream_generation(pipe, fps=8, session_options=options, **kwargs):
                    raise AssertionError("the block must not be entered")
    finally:
        hook.remove()
    assert forwards == []  # no denoising step ran
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("prompt", "batch"), [("a fox", 2), (["a fox", "a hen", "a cat"], 6)])
async def test_the_batch_of_a_call_with_prompts_is_its_prompts_times_num_videos_per_prompt(
    prompt: str | list[str], batch: int, tmp_path: Path
) -> None:
    pipe, make_kwargs = BUILDERS["wan21"]()
    kwargs = {key: value for key, value in make_kwargs().items() if "prompt_embeds" not in key}
    options = {**PINNED, "output_files": [tmp_path / "one.mp4"]}
    message = f"^generate_mp4: output_files has 1 paths but the batch has {batch} entries$"
    with pytest.raises(ValueError, match=message):
        await generate_mp4(
            pipe, fps=8, session_options=options, prompt=prompt, num_videos_per_prompt=2, **kwargs
        )


async def test_output_files_that_fit_the_batch_are_written(tmp_path: Path) -> None:
    pipe, make_kwargs = BUILDERS["wan21"]()
    files = [tmp_path / "a.mp4", tmp_path / "b.mp4"]
    options = {**PINNED, "output_files": files}
    videos = await generate_mp4(
        pipe, fps=8, session_options=options, num_videos_per_prompt=2, **make_kwargs()
    )
    assert [path.read_bytes() for path in files] == videos
    assert [read_mp4(video).frames.shape[0] for video in videos] == [9, 9]


# -- the server: options that fit no session are refused when it is built --


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (
            {"output": "mp4"},
            r"session_options must write fragmented MP4 \(output='fragmented'\), got output='mp4'",
        ),
        ({"output": "mp4", "keyframe_interval": 4}, "session_options must write fragmented MP4"),
        ({"audio_channels": 1, "audio_sample_rate": 16000}, "session_options: audio_channels cannot be set"),
        ({"audio_waveforms": [None], "audio_sample_rate": 16000}, "session_options: audio_waveforms cannot"),
        ({"output_files": ["served.mp4"]}, "session_options: output_files cannot be set for a server"),
    ],
)
def test_create_app_refuses_session_options_no_request_could_run_with(
    vae: Any, options: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=f"^create_app: {problem}"):
        create_app(vae=vae, session_options=options)


def test_realtime_video_endpoint_refuses_a_live_audio_track_of_its_own(vae: Any) -> None:
    options = SessionOptions(
        value_range=(-1, 1), fps=16, output="fragmented", audio_channels=1, audio_sample_rate=16000
    )
    with pytest.raises(ValueError, match="^realtime_video_endpoint: options: audio_channels cannot be set"):
        realtime_video_endpoint(vae, options=options)


async def test_an_app_built_with_fitting_options_serves_the_websocket_and_video_mp4(vae: Any) -> None:
    app = create_app(vae=vae, session_options={**PINNED, "fragment_frames": 4})
    async with connect(app) as client:
        await client.send_json({"type": "session.start", "num_frames": 5, "width": 32, "height": 32})
        assert (await client.receive_json())["type"] == "video.start"
        pieces, done = await client.receive_until_done()
    check_pieces(pieces, done["request_id"], 5)
    # An app's loop-bound objects are its first request's loop's: uvicorn's is another.
    app = create_app(vae=vae, session_options={**PINNED, "fragment_frames": 4})
    response = await get_once(app, "/video.mp4?frames=5&size=32")
    assert response.status_code == 200 and read_mp4(response.content).frames.shape[0] == 5


# -- /video.mp4?realtime=1: the generator's refusal is a 400 --


def _refusing_when_called(start: dict[str, Any], interactions: Interactions) -> AsyncIterator[RealtimePiece]:
    raise ValueError(f"num_frames {start['num_frames']} is more than this model makes")


async def _refusing_at_its_first_piece(
    start: dict[str, Any], interactions: Interactions
) -> AsyncIterator[RealtimePiece]:
    if start["seed"] == 7:
        raise ValueError("seed 7 is reserved by this model")
    yield RealtimePiece(demo_latent(1, 16, start["seed"]))


@pytest.mark.parametrize(
    ("generator", "query", "message"),
    [
        (_refusing_when_called, "frames=5&size=16", "num_frames 5 is more than this model makes"),
        (_refusing_at_its_first_piece, "frames=1&size=16&seed=7", "seed 7 is reserved by this model"),
    ],
)
async def test_a_realtime_generator_refusing_the_query_is_a_400_with_its_message(
    vae: Any, no_leaks: None, generator: Any, query: str, message: str
) -> None:
    app = create_app(vae=vae, generator=generator, session_options=PINNED)
    response = await get_once(app, f"/video.mp4?{query}&realtime=1&delay=0")
    assert response.status_code == 400, response.text
    assert response.text == f"{message}\n"
    app = create_app(vae=vae, generator=generator, session_options=PINNED)  # on this test's loop
    async with connect(app) as client:  # the WebSocket's error carries the same message
        await client.send_json({"type": "session.start", "num_frames": 5, "seed": 7})
        error = await next_message(client)
        await client.closed()
    assert message in error["message"], error


async def test_a_realtime_generator_that_accepts_the_query_streams_its_pieces(
    vae: Any, no_leaks: None
) -> None:
    app = create_app(vae=vae, generator=_refusing_at_its_first_piece, session_options=PINNED)
    response = await get_once(app, "/video.mp4?frames=1&size=16&seed=8&realtime=1&delay=0")
    assert response.status_code == 200
    assert read_mp4(response.content).frames.shape[0] == 1


# -- the WebSocket: one answer per interaction --


class _BuggyChecker:
    """A generator whose ``check_interaction`` has a bug (raises ``error``), whose third piece waits for
    ``gate``: the session is mid-generation when the interaction comes."""

    def __init__(self, error: Exception, gate: anyio.Event) -> None:
        self.error = error
        self.gate = gate

    async def __call__(
        self, start: dict[str, Any], interactions: Interactions
    ) -> AsyncIterator[torch.Tensor]:
        latent = demo_latent(9, 16, 0)
        yield latent[:, :, :1]
        yield latent[:, :, 1:2]  # the first piece goes out once the next frame closes its fragment
        await self.gate.wait()
        yield latent[:, :, 2:]

    def check_interaction(self, interaction: object) -> None:
        raise self.error


@pytest.mark.parametrize(
    "error", [KeyError("prompt"), TypeError("unhashable"), RuntimeError("the checker's own bug")]
)
async def test_a_check_interaction_bug_answers_the_interaction_then_fails_the_session(
    vae: Any, no_leaks: None, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    # A RuntimeError is also what a closed socket's send raises: the session must not take the generator's
    # bug for a client that left (counted "disconnected", nothing said), but end failed and say so.
    gate, events = anyio.Event(), EventLog()
    app = create_app(vae=vae, generator=_BuggyChecker(error, gate), on_event=events, session_options=PINNED)
    async with connect(app) as client:
        await client.send_json({"type": "session.start"})
        assert (await client.receive_json())["type"] == "video.start"
        await client.send_json(interaction("e1", {"prompt": "a"}))
        answer = await next_message(client)
        gate.set()
        last = await next_message(client)
        assert await client.closed() == 1011
    assert answer["type"] == "error" and answer["code"] == "interaction_failed", answer
    assert "e1" in answer["message"], answer
    assert last["type"] == "error" and last["code"] == "generation_failed", last
    assert "the server's log has why" in last["message"], last  # a server's bug is not told
    assert str(error.args[0]) in caplog.text
    assert [event.kind for event in events.events][-1] == "failed", events.events


# -- the stand-in: no client's message kills it --


async def test_the_stand_in_applies_what_it_can_and_refuses_the_rest_without_dying(
    vae: Any, no_leaks: None
) -> None:
    # A null prompt is no prompt (the seed applies); a lone surrogate is no text to hash (refused).
    start = {
        "type": "session.start",
        "num_frames": 17,
        "width": 48,
        "height": 32,
        "seed": 3,
        "step_seconds": 1.0,
    }
    app = create_app(vae=vae, session_options=PINNED)
    pieces: Pieces = []
    async with connect(app) as client:
        await client.send_json(start)
        assert (await client.receive_json())["type"] == "video.start"
        await client.send_json(interaction("surrogate", {"prompt": "\ud800"}))
        refused = await client.receive_other(pieces)
        await client.send_json(interaction("seeded", {"prompt": None, "seed": 5}))
        queued = await client.receive_other(pieces)
        rest, done = await client.receive_until_done()
        assert await client.closed() == 1000
    assert refused["type"] == "error" and refused["code"] == "interaction_failed", refused
    assert "event.prompt must be Unicode text" in refused["message"], refused
    assert queued == {
        "type": "session.interaction.queued",
        "request_id": done["request_id"],
        "event_id": "seeded",
    }
    pieces += rest
    check_pieces(pieces, done["request_id"], 17)
    assert [meta["started_event_ids"] for meta, _ in pieces].count(["seeded"]) == 1
    assert not done["stopped"]


# -- the CLI: one line, before the work --


@pytest.mark.parametrize(
    ("port", "message"),
    [
        ("99999", r"argument --port: must be from 0 \(any free port\) to 65535, got 99999"),
        ("-1", r"argument --port: must be from 0 \(any free port\) to 65535, got -1"),
        ("http", r"argument --port: not a whole number: 'http'"),
    ],
)
def test_serve_on_a_port_out_of_range_is_one_line_naming_it(
    port: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", port]) == 1
    assert re.search(message, one_line_error(capsys))


def test_serve_on_a_busy_port_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = one_line_error(capsys)
    assert f"--port {port}: 127.0.0.1:{port} is in use already" in err


def test_serve_says_where_it_listens_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--host HOST address to listen on (default 127.0.0.1;" in text
    assert "--port PORT TCP port to listen on (default 8000; 0: any free port)" in text


@pytest.mark.parametrize("seed", [str(2**64), "-1", "1e3"])
def test_a_demo_seed_out_of_range_is_refused_before_the_vae_is_built(
    seed: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import streamvae.demo

    def no_vae() -> None:
        raise AssertionError("the VAE must not be built")

    monkeypatch.setattr(streamvae.demo, "demo_vae", no_vae)
    assert main(["demo", "-o", str(tmp_path / "x.mp4"), "--seed", seed]) == 1
    err = one_line_error(capsys)
    assert err.startswith("streamvae: error: argument --seed: "), err
    expected = "not a whole number" if seed == "1e3" else f"must be from 0 to 2**64 - 1 ({2**64 - 1}), got"
    assert expected in err, err
    assert os.listdir(tmp_path) == []


def test_the_largest_demo_seed_is_taken() -> None:
    args = build_parser().parse_args(["demo", "--seed", str(2**64 - 1)])
    assert args.seed == 2**64 - 1


# Each backend once, and each SIGINT setting once (a run is a fresh interpreter: ~10 s on 2 cores).
@pytest.mark.slow
@pytest.mark.parametrize(("backend", "sigint"), [("asyncio", "default"), ("trio", "ignored")])
def test_sigterm_while_decoding_is_one_line_exit_143_and_leaves_the_earlier_file(
    backend: str, sigint: str, tmp_path: Path
) -> None:
    check_signal_mid_decode(
        tmp_path,
        backend,
        signal.SIGTERM,
        status=143,
        said="streamvae: terminated\n",
        sigint_ignored=sigint == "ignored",
    )


# -- the docs a newcomer reads first --

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md", "docs/guides/cli.md"])
def test_the_pages_after_make_demo_say_how_to_run_the_command_from_its_venv(page: str) -> None:
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert "`.venv/bin/streamvae" in text and "`source .venv/bin/activate`" in text


def test_the_serve_guide_says_in_its_text_to_save_the_app_as_app_py() -> None:
    page = (ROOT / "docs/guides/serve.md").read_text(encoding="utf-8")
    before_the_code = page[: page.index("<!-- file: app.py -->")]
    visible = re.sub(r"<!--.*?-->", "", before_the_code, flags=re.DOTALL)
    assert "Save it as `app.py`" in " ".join(visible.split())


def test_the_reference_of_streamvae_says_the_lazy_import_sentence_once() -> None:
    import streamvae

    # The page's text and the module docstring its automodule directive renders.
    page = (ROOT / "docs/reference/streamvae.md").read_text(encoding="utf-8")
    rendered = " ".join((page + (streamvae.__doc__ or "")).split())
    assert rendered.count("imports neither torch nor PyAV") == 1
