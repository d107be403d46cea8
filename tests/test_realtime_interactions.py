"""Interactive real-time: a client steers the stand-in over ``WS /v1/realtime/video`` and hears it.

The interactions are vllm-omni's (``session.interaction``): each gets one answer, the pieces that reflect it
name its ``event_id``, and the stand-in's video changes from the next piece it generates, as a decode of
the changed latent shows. Sound comes in the same fragmented MP4, and the app counts each session's outcome.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import av
import numpy as np
import pytest
import torch

from streamvae import decode_to_mp4
from streamvae.demo import demo_latent
from streamvae.server import Interactions, RealtimePiece, create_app, demo_generator
from streamvae.server._standin import DEMO_SAMPLE_RATE, seed_of_prompt
from streamvae.server._websocket import MAX_PENDING_INTERACTIONS
from tests._media import DETERMINISTIC_X264, count_frames, read_mp4
from tests._server import EventLog, running_server
from tests._websocket import HANG, PATH, PINNED, Client, Pieces, app_of, check_pieces, connect

pytestmark = pytest.mark.anyio

#: 5 latent steps of 48 × 32, a second between the pieces the stand-in generates
STEERED = {"type": "session.start", "num_frames": 17, "width": 48, "height": 32, "seed": 3}


def interaction(event_id: str | None, event: object, transition: object = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"event": event, "transition_chunks": transition}
    if event_id is not None:
        body["event_id"] = event_id
    return {"type": "session.interaction", "interaction": body}


async def first_piece(client: Client, start: dict[str, Any]) -> tuple[dict[str, Any], Pieces]:
    """Start the session; its ``video.start`` and the first piece."""
    await client.send_json(start)
    started = await client.receive_json()
    assert started["type"] == "video.start", started
    meta = await client.receive_json()
    assert meta["type"] == "video.chunk_metadata", meta
    return started, [(meta, await client.receive_bytes())]


def first_frame_of(step: int) -> int:
    """The first video frame of a Wan decode's latent step (1 frame, then 4 a step)."""
    return 0 if step == 0 else 1 + 4 * (step - 1)


def stand_in_latent(seed: int) -> torch.Tensor:
    return demo_latent(17, 48, seed)[..., :4, :6]


async def test_a_prompt_changes_the_stand_in_from_the_next_piece_and_the_pieces_name_it(
    vae: Any, no_leaks: None
) -> None:
    app = app_of(vae)
    async with connect(app) as client:  # the same session, unsteered
        await client.send_json(STEERED)
        await client.receive_json()
        plain, _ = await client.receive_until_done()
    async with connect(app) as client:
        started, pieces = await first_piece(client, {**STEERED, "step_seconds": 1.0})
        sent_at = anyio.current_time()
        await client.send_json(interaction("e1", {"prompt": "a red fox"}))
        answer = await client.receive_other(pieces)
        rest, done = await client.receive_until_done()
        seen_at = anyio.current_time()
    pieces += rest
    assert answer == {
        "type": "session.interaction.queued",
        "request_id": started["request_id"],
        "event_id": "e1",
    }
    video = check_pieces(pieces, started["request_id"], 17)
    (first,) = [meta for meta, _ in pieces if meta["started_event_ids"]]
    assert first["started_event_ids"] == ["e1"] and first["completed_event_ids"] == ["e1"]
    assert all(meta["active_event_ids"] == [] for meta, _ in pieces)  # no transition: done at once
    assert sum(meta["completed_event_ids"] == ["e1"] for meta, _ in pieces) == 1
    step = first["generation_chunk_index"]
    assert step >= 1  # it came while the session ran: the first piece was out before it
    # Before that piece: exactly the frames of the session without the interaction.
    steered, unsteered = read_mp4(video).frames, read_mp4(check_pieces(plain, _request(plain), 17)).frames
    cut = first_frame_of(step)
    assert np.array_equal(steered[:cut], unsteered[:cut])
    # From it: the latent reseeded from the prompt, as a whole decode of the changed latent shows.
    old, new = stand_in_latent(3), stand_in_latent(seed_of_prompt("a red fox"))
    changed = torch.cat([old[:, :, :step], new[:, :, step:]], dim=2)
    (expected,) = await decode_to_mp4(vae, changed, options=PINNED)
    reference = read_mp4(expected).frames
    assert np.abs(steered[cut:].astype(int) - reference[cut:].astype(int)).mean() < 1.0
    assert np.abs(steered[cut:].astype(int) - unsteered[cut:].astype(int)).mean() > 5.0
    # Control to photon: from the server reading it to the frame that shows it, within what the client saw.
    (latency,) = done["statistics"]["control_to_photon_seconds"]
    assert 0 < latency < seen_at - sent_at


def _request(pieces: Pieces) -> str:
    request_id: str = pieces[0][0]["request_id"]
    return request_id


async def test_a_transition_is_started_at_one_piece_active_between_and_completed_n_pieces_later(
    vae: Any, no_leaks: None
) -> None:
    async with connect(app_of(vae)) as client:
        _, pieces = await first_piece(client, {**STEERED, "step_seconds": 1.0})
        await client.send_json(interaction("fade", {"seed": 11}, transition=2))
        assert (await client.receive_other(pieces))["type"] == "session.interaction.queued"
        rest, _ = await client.receive_until_done()
    pieces += rest
    steps: dict[int, list[dict[str, Any]]] = {}
    for meta, _ in pieces:
        steps.setdefault(meta["generation_chunk_index"], []).append(meta)
    (start,) = [step for step, metas in steps.items() if any(m["started_event_ids"] for m in metas)]
    (end,) = [step for step, metas in steps.items() if any(m["completed_event_ids"] for m in metas)]
    assert end == start + 2 <= 4
    for step, metas in steps.items():
        active = start <= step < end
        assert all(m["active_event_ids"] == (["fade"] if active else []) for m in metas), (step, metas)


@pytest.mark.parametrize(
    ("message", "code", "error"),
    [
        ({"type": "session.interaction"}, "invalid_message", "interaction must be an object, got None"),
        ({"type": "session.interaction", "interaction": [1]}, "invalid_message", "interaction must be an"),
        (interaction("x", "a cat"), "invalid_message", "event must be an object, got 'a cat'"),
        (
            interaction("x", {"prompt": "p"}, -1),
            "invalid_message",
            "transition_chunks must be an integer >= 0",
        ),
        (interaction("x", {"prompt": "p"}, "2"), "invalid_message", "transition_chunks must be an integer"),
        (interaction("x", {"prompt": "p"}, True), "invalid_message", "transition_chunks must be an integer"),
        (
            {**interaction(None, {}), "interaction": {"event_id": 5, "event": {}}},
            "invalid_message",
            "event_id",
        ),
        (interaction("", {"prompt": "p"}), "invalid_message", "event_id must be a string of 1 to 256"),
        (interaction("x", {"camera": [0, 1]}), "interaction_failed", "a prompt (a string) or a seed"),
        (interaction("x", {"prompt": 3}), "interaction_failed", "event.prompt must be a string, got 3"),
        (interaction("x", {"seed": -1}), "interaction_failed", "event.seed must be an integer from 0"),
    ],
)
async def test_a_bad_interaction_is_an_error_with_its_code_and_the_session_goes_on(
    vae: Any, no_leaks: None, message: dict[str, Any], code: str, error: str
) -> None:
    async with connect(app_of(vae)) as client:
        _, pieces = await first_piece(client, {**STEERED, "num_frames": 9, "step_seconds": 0.3})
        await client.send_json(message)
        answer = await client.receive_other(pieces)
        await client.send_json(interaction("good", {"prompt": "a boat"}))  # the session still takes one
        queued = await client.receive_other(pieces)
        rest, done = await client.receive_until_done()
    assert answer["type"] == "error" and answer["code"] == code, answer
    assert error in answer["message"] and len(answer["message"]) < 300, answer
    assert queued["type"] == "session.interaction.queued" and queued["event_id"] == "good"
    assert done["stopped"] is False
    check_pieces(pieces + rest, done["request_id"], 9)


async def test_a_duplicate_event_id_is_a_conflict_and_a_missing_one_is_made(vae: Any, no_leaks: None) -> None:
    async with connect(app_of(vae)) as client:
        _, pieces = await first_piece(client, {**STEERED, "step_seconds": 0.3})
        await client.send_json(interaction("e1", {"prompt": "a"}))
        assert (await client.receive_other(pieces))["event_id"] == "e1"
        await client.send_json(interaction("e1", {"prompt": "b"}))
        conflict = await client.receive_other(pieces)
        await client.send_json(interaction(None, {"prompt": "c"}))
        made = await client.receive_other(pieces)
        rest, _ = await client.receive_until_done()
    assert conflict["type"] == "error" and conflict["code"] == "event_id_conflict", conflict
    assert made["type"] == "session.interaction.queued" and made["event_id"].startswith("evt-")
    reported = [i for meta, _ in pieces + rest for i in meta["started_event_ids"]]
    assert reported == ["e1", made["event_id"]] or sorted(reported) == sorted(["e1", made["event_id"]])


async def test_a_generator_of_the_start_alone_refuses_each_interaction(vae: Any, no_leaks: None) -> None:
    latent = demo_latent(9, 16, 0)
    gate = anyio.Event()

    async def no_interactions(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        yield latent[:, :, :1]
        yield latent[:, :, 1:2]  # the first piece goes out once the next frame closes its fragment
        await gate.wait()
        yield latent[:, :, 2:]

    async with connect(app_of(vae, generator=no_interactions)) as client:
        _, pieces = await first_piece(client, {"type": "session.start"})
        await client.send_json(interaction("e1", {"prompt": "a"}))
        answer = await client.receive_other(pieces)
        gate.set()
        await client.receive_until_done()
    assert answer["code"] == "interaction_failed" and "takes no interactions" in answer["message"]


async def test_an_interaction_after_stop_is_an_error_and_none_goes_unanswered(
    vae: Any, no_leaks: None
) -> None:
    closing = anyio.Event()
    latent = demo_latent(9, 16, 0)

    async def slow_to_close(start: dict[str, Any], interactions: Interactions) -> AsyncIterator[torch.Tensor]:
        try:
            yield latent[:, :, :1]
            yield latent[:, :, 1:2]
            await anyio.sleep_forever()
            yield latent  # never
        finally:
            with anyio.CancelScope(shield=True):
                await closing.wait()  # the session cannot say goodbye before the test lets the generator go

    async with connect(app_of(vae, generator=slow_to_close)) as client:
        _, pieces = await first_piece(client, {"type": "session.start"})
        await client.send_json({"type": "session.stop"})
        await client.send_json(interaction("late", {"prompt": "a"}))
        late = await client.receive_other(pieces)
        await client.send_json({"type": "session.stop"})
        again = await client.receive_other(pieces)
        closing.set()
        done = await client.receive_other(pieces)
    assert late["type"] == "error" and late["code"] == "session_stopped", late
    assert again["type"] == "error" and again["code"] == "session_stopped", again
    assert done["type"] == "session.done" and done["stopped"] is True


async def test_a_burst_of_interactions_is_answered_one_by_one_and_a_ping_after_it_soon(
    vae: Any, no_leaks: None
) -> None:
    count = 2 * MAX_PENDING_INTERACTIONS
    async with connect(app_of(vae)) as client:
        _, pieces = await first_piece(client, {**STEERED, "step_seconds": 2.0})
        for number in range(count):
            await client.send_json(interaction(f"b{number}", {"prompt": f"burst {number}"}))
        await client.send_json({"type": "session.ping"})
        answers: list[dict[str, Any]] = []
        with anyio.fail_after(HANG):  # hang guard, not a timing check
            while (answer := await client.receive_other(pieces))["type"] != "session.pong":
                answers.append(answer)
        await client.send_json({"type": "session.stop"})
        await client.receive_other(pieces)
    queued = [a["event_id"] for a in answers if a["type"] == "session.interaction.queued"]
    refused = [a for a in answers if a["type"] == "error"]
    assert len(answers) == count  # one answer each, none dropped, none twice
    assert all(a["code"] == "interaction_failed" for a in refused)
    assert queued == [f"b{n}" for n in range(count) if f"b{n}" in set(queued)]  # in the order sent
    assert len(queued) >= MAX_PENDING_INTERACTIONS


def decoded_audio(data: bytes) -> tuple[np.ndarray, int, float]:
    """The audio PyAV decodes from an MP4 (mono samples), its rate, and the video's duration in seconds."""
    with av.open(io.BytesIO(data)) as container:
        rate = container.streams.audio[0].rate
        fps = float(container.streams.video[0].average_rate)
        samples = [frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]
    return (np.concatenate(samples) if samples else np.zeros(0, np.float32)), rate, count_frames(data) / fps


async def test_the_stand_in_sends_its_tone_in_the_stream_in_step_with_the_video(
    vae: Any, no_leaks: None
) -> None:
    start = {**STEERED, "audio": True, "seed": 7}
    async with connect(app_of(vae)) as client:
        await client.send_json(start)
        started = await client.receive_json()
        pieces, _ = await client.receive_until_done()
    video = check_pieces(pieces, started["request_id"], 17)
    # What the stand-in made, piece by piece.
    made = [piece async for piece in demo_generator(fps=16)(start, Interactions())]
    pushed = torch.cat([piece.audio[0] for piece in made if piece.audio is not None]).numpy()
    heard, rate, seconds = decoded_audio(video)
    assert rate == DEMO_SAMPLE_RATE == made[0].sample_rate
    assert len(pushed) == round(17 / 16 * rate)
    assert abs(len(heard) - len(pushed)) <= rate // 16  # as long as the video, within a frame
    assert abs(len(heard) / rate - seconds) <= 1 / 16
    # The tone it pushed, within AAC's loss (AAC's priming is trimmed by the edit list).
    length = min(len(heard), len(pushed)) - 2048
    correlation = np.corrcoef(heard[1024:length], pushed[1024:length])[0, 1]
    assert correlation > 0.98
    # At every piece the sound so far is within a frame of the pictures so far.
    shown = b""
    for _, data in pieces[:-1]:
        shown += data
        audio, _, video_seconds = decoded_audio(shown)
        assert abs(len(audio) / rate - video_seconds) <= 1 / 16 + 1024 / rate, (len(audio), video_seconds)


async def test_pieces_with_wrong_audio_fail_the_session_with_the_reason(vae: Any, no_leaks: None) -> None:
    latent = demo_latent(9, 16, 0)

    async def sound_then_none(start: dict[str, Any], interactions: Interactions) -> AsyncIterator[Any]:
        yield RealtimePiece(latent[:, :, :1], torch.zeros(1, 3000), 48_000)
        yield latent[:, :, 1:2]

    async with connect(app_of(vae, generator=sound_then_none)) as client:
        # It fails before its first piece is written: no video.start, which comes with that piece.
        message = await client.receive_until_it_fails()
    assert message["code"] == "generation_failed"
    assert "piece 1 has no audio, but the generation's first piece had" in message["message"]


# -- the app: outcomes, queue, refusal --


async def test_the_app_counts_each_sessions_true_outcome_once(vae: Any, no_leaks: None) -> None:
    events = EventLog()
    stand_in = demo_generator(fps=16)
    latent = demo_latent(9, 32, 5)

    def model(start: dict[str, Any], interactions: Interactions) -> AsyncIterator[Any]:
        return held(start) if start.get("hold") else stand_in(start, interactions)

    async def held(start: dict[str, Any]) -> AsyncIterator[torch.Tensor]:
        yield latent[:, :, :1]
        yield latent[:, :, 1:2]
        await anyio.sleep_forever()  # until the session ends it
        yield latent

    app = create_app(
        vae=vae,
        generator=model,
        on_event=events,
        stall_timeout=1.0,
        session_options={"video_codec_options": DETERMINISTIC_X264},
    )
    slow = {"type": "session.start", "hold": True}
    async with connect(app) as client:  # completed
        await client.send_json({**STEERED, "num_frames": 5})
        await client.receive_json()
        await client.receive_until_done()
    async with connect(app) as client:  # stopped
        await first_piece(client, slow)
        await client.send_json({"type": "session.stop"})
        assert (await client.receive_other([]))["stopped"] is True
    async with connect(app) as client:  # disconnected
        await first_piece(client, slow)
        await client.leave()
    async with connect(app) as client:  # stalled: the client says nothing while nothing comes
        await first_piece(client, slow)
        assert (await client.receive_other([]))["code"] == "stall_timeout"
    async with connect(app) as client:  # failed: a start the stand-in refuses
        await client.send_json({**STEERED, "num_frames": 6})
        assert (await client.receive_json())["code"] == "invalid_start"
    kinds = ["completed", "stopped", "disconnected", "stalled", "failed"]
    with anyio.fail_after(HANG):  # hang guard: the last ending event comes once its session is closed
        while len([e for e in events.events if e.kind in kinds]) < len(kinds):
            await anyio.sleep(0.01)
    stats = app.state.stats
    assert [getattr(stats, kind) for kind in kinds] == [1] * len(kinds)
    assert stats.active == stats.queued == stats.rejected == 0
    endings = [e for e in events.events if e.kind not in ("queued", "started")]
    assert [e.kind for e in endings] == kinds
    assert len({e.number for e in endings}) == len(kinds)  # one ending each
    assert all(e.request_id and e.request is None for e in endings)
    started = {e.number for e in events.events if e.kind == "started"}
    assert started == {e.number for e in endings[:-1]}  # the refused start never took a slot
    # Their latency is the app's too: the completed and the stopped session's numbers are kept.
    async with connect(app) as client:
        await first_piece(client, {**STEERED, "num_frames": 9, "step_seconds": 0.5})
        await client.send_json(interaction("k", {"prompt": "x"}))
        await client.receive_other([])
        await client.receive_until_done()
    with anyio.fail_after(HANG):
        while stats.completed < 2:
            await anyio.sleep(0.01)
    summary = app.state.latency
    assert summary.summary()["requests"] == 3
    assert summary.control_to_photon()["interactions"] == 1


class HeldOnRequest:
    """A generator of 3 latent steps; a session whose start says ``"hold": true`` holds after the first two
    (its first piece is out) until :attr:`release` is set, keeping its decode slot."""

    def __init__(self) -> None:
        self.latent = demo_latent(9, 32, 5)
        self.release = anyio.Event()

    async def __call__(
        self, start: dict[str, Any], interactions: Interactions
    ) -> AsyncIterator[torch.Tensor]:
        yield self.latent[:, :, :1]
        yield self.latent[:, :, 1:2]
        if start.get("hold"):
            await self.release.wait()
        yield self.latent[:, :, 2:]


async def test_a_queued_websocket_client_is_accepted_and_answered_while_it_waits(
    vae: Any, no_leaks: None
) -> None:
    held = HeldOnRequest()

    app = create_app(vae=vae, generator=held, max_concurrent=1, max_queued=1)
    async with connect(app) as first:
        await first_piece(first, {"type": "session.start", "hold": True})
        async with connect(app) as second:  # accepted at once: connect() waits for the accept
            await second.send_json({"type": "session.start"})
            await second.send_json({"type": "session.ping"})
            assert await second.receive_json() == {"type": "session.pong"}  # no video.start: still queued
            assert (app.state.stats.active, app.state.stats.queued) == (1, 1)
            held.release.set()
            await first.receive_until_done()
            assert (await second.receive_json())["type"] == "video.start"
            pieces, done = await second.receive_until_done()
    assert done["stopped"] is False and pieces
    assert app.state.stats.completed == 2 and app.state.stats.active == app.state.stats.queued == 0


def test_a_real_client_beyond_every_slot_reads_503_and_retry_after(vae: Any) -> None:
    from websockets import exceptions
    from websockets.sync import client as sync_client

    latent = demo_latent(5, 16, 0)
    release = anyio.Event()

    async def held(start: dict[str, Any], interactions: Interactions) -> AsyncIterator[torch.Tensor]:
        yield latent[:, :, :1]
        yield latent[:, :, 1:2]
        await release.wait()
        yield latent[:, :, 2:]

    app = create_app(vae=vae, generator=held, max_concurrent=1, max_queued=0, retry_after=7)
    with running_server(app) as url:
        ws_url = url.replace("http", "ws") + PATH
        with sync_client.connect(ws_url) as holder:
            holder.send(json.dumps({"type": "session.start"}))
            assert json.loads(holder.recv(timeout=HANG))["type"] == "video.start"
            with pytest.raises(exceptions.InvalidStatus) as refused:
                sync_client.connect(ws_url, open_timeout=HANG)
            holder.send(json.dumps({"type": "session.stop"}))
            while json.loads(holder.recv(timeout=HANG)).get("type") != "session.done":
                holder.recv(timeout=HANG)  # a piece's binary frame
    response = refused.value.response
    assert response.status_code == 503 and response.headers["Retry-After"] == "7"
    assert b"busy" in response.body
    assert app.state.stats.rejected == 1 and app.state.stats.stopped == 1


async def test_http_realtime_runs_the_apps_generator_on_the_same_path(vae: Any) -> None:
    starts: list[dict[str, Any]] = []
    latent = demo_latent(9, 32, 2)

    async def model(start: dict[str, Any], interactions: Interactions) -> AsyncIterator[RealtimePiece]:
        starts.append(start)
        assert not interactions.take()
        for step in range(latent.shape[2]):
            yield RealtimePiece(latent[:, :, step : step + 1], started=("s",) if step == 1 else ())

    import httpx

    app = create_app(vae=vae, generator=model, session_options={"video_codec_options": DETERMINISTIC_X264})
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as client:
            response = await client.get("/video.mp4?frames=9&size=32&seed=4&realtime=1&delay=0.5")
    assert response.status_code == 200
    assert starts == [{"num_frames": 9, "width": 32, "height": 32, "seed": 4, "step_seconds": 0.5}]
    assert read_mp4(response.content).frames.shape == (9, 32, 32, 3)


async def test_a_concurrent_soak_of_steering_clients_that_leave_early_leaks_nothing(
    vae: Any, no_leaks: None
) -> None:
    """Sessions at once, beyond the slots: each steers (good and bad interactions alike), and each ends
    its own way. Every interaction gets its one answer, every session one outcome, and nothing is left."""
    events = EventLog()
    app = create_app(
        vae=vae,
        on_event=events,
        max_concurrent=3,
        max_queued=32,
        session_options={"video_codec_options": DETERMINISTIC_X264},
    )
    start = {"type": "session.start", "num_frames": 13, "width": 32, "height": 32, "step_seconds": 0.05}
    ends = ("complete", "stop", "leave")
    answered: list[int] = []

    async def client_session(number: int) -> None:
        end = ends[number % len(ends)]
        async with connect(app) as client:
            slow = {"step_seconds": 0.5} if end != "complete" else {}  # still generating when it ends
            _, pieces = await first_piece(client, {**start, "seed": number, **slow})
            sent = [
                interaction(f"s{number}", {"prompt": f"soak {number}"}),
                interaction(f"s{number}", {"prompt": "again"}),  # a duplicate
                interaction(None, {"prompt": 7}),  # a prompt that is no string
                {"type": "session.interaction", "interaction": "no"},  # wrong type
            ]
            for message in sent:
                await client.send_json(message)
            answers = [await client.receive_other(pieces) for _ in sent]
            assert [a["type"] for a in answers[1:]] == ["error"] * 3, answers
            assert answers[0]["type"] == "session.interaction.queued"
            answered.append(len(answers))
            if end == "leave":
                await client.leave()
                return
            if end == "stop":
                await client.send_json({"type": "session.stop"})
            done = await client.receive_other(pieces)
            assert done["type"] == "session.done" and done["stopped"] is (end == "stop"), done

    sessions = 12
    with anyio.fail_after(HANG):  # hang guard
        async with anyio.create_task_group() as group:
            for number in range(sessions):
                group.start_soon(client_session, number)
        kinds = ("completed", "stopped", "disconnected")
        while sum(e.kind in kinds for e in events.events) < sessions:
            await anyio.sleep(0.01)
    stats = app.state.stats
    assert answered == [4] * sessions
    assert stats.active == stats.queued == stats.rejected == stats.failed == stats.stalled == 0
    assert (stats.completed, stats.stopped, stats.disconnected) == (4, 4, 4)
    endings = [e for e in events.events if e.kind in kinds]
    assert len({e.request_id for e in endings}) == sessions  # one ending each


async def test_http_realtime_carries_the_stand_ins_sound_on_the_same_path(vae: Any) -> None:
    import httpx

    app = create_app(vae=vae, session_options={"video_codec_options": DETERMINISTIC_X264})
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=HANG) as client:
            sound = await client.get("/video.mp4?frames=17&size=32&seed=7&realtime=1&delay=0&audio=1")
            whole = await client.get("/video.mp4?frames=17&size=32&audio=1")
            user = create_app(vae=vae, latents=lambda request: demo_latent(5, 16, 0))
            with running_server(user) as other:
                latent = await client.get(f"{other}/video.mp4?frames=5&size=16&realtime=1&audio=1")
    assert sound.status_code == 200
    heard, rate, seconds = decoded_audio(sound.content)
    request = {"num_frames": 17, "width": 32, "height": 32, "seed": 7, "audio": True}
    made = [p async for p in demo_generator(fps=16)(request)]
    pushed = torch.cat([p.audio[0] for p in made if p.audio is not None]).numpy()
    assert rate == DEMO_SAMPLE_RATE and abs(len(heard) / rate - seconds) <= 1 / 16
    length = min(len(heard), len(pushed)) - 2048
    assert np.corrcoef(heard[1024:length], pushed[1024:length])[0, 1] > 0.98
    for refused in (whole, latent):  # no generator to make the sound: a 400, not a silent video
        assert (
            refused.status_code == 400 and "audio=1 needs realtime=1 and the app's generator" in refused.text
        )


async def test_a_wait_in_the_queue_longer_than_the_stall_timeout_is_no_stall(
    vae: Any, no_leaks: None
) -> None:
    held = HeldOnRequest()

    # 3 s: once it has its slot, the second's first piece (two decode steps and the encoder's open) must go
    # out within the stall timeout, which 1 s did not always leave on a loaded 2-core machine. The first
    # pings until its end, so that only the second's silence is under test (its last step, decoded on a
    # loaded machine, may take longer than a stall timeout, which a silent client would be cut off for).
    app = create_app(vae=vae, generator=held, max_concurrent=1, max_queued=1, stall_timeout=3.0)
    async with connect(app) as first, anyio.create_task_group() as pinging:
        await first_piece(first, {"type": "session.start", "hold": True})

        ended = anyio.Event()

        async def keep_alive() -> None:
            while not ended.is_set():
                await first.send_json({"type": "session.ping"})
                await anyio.sleep(0.5)

        pinging.start_soon(keep_alive)
        async with connect(app) as second:
            await second.send_json({"type": "session.start"})  # then silent, queued past the stall timeout
            while app.state.stats.queued < 1:
                await anyio.sleep(0.01)
            pongs = 0
            while pongs < 8:  # the first stays alive meanwhile; the second says nothing for 4 s
                pongs += (await first.receive_other([]))["type"] == "session.pong"
            held.release.set()
            while (ending := await first.receive_other([]))["type"] == "session.pong":
                pass
            ended.set()
            assert ending["type"] == "session.done", ending
            assert (await second.receive_json())["type"] == "video.start"
            _, done = await second.receive_until_done()
    assert done["type"] == "session.done" and app.state.stats.stalled == 0
