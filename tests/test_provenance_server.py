"""Content Credentials on the server: every stream is marked, and once a generation ends complete its
replay is the recording signed, and the bytes as streamed verify against a detached manifest."""

from __future__ import annotations

import io
import logging
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import c2pa
import httpx
import pytest
from starlette.applications import Starlette

from streamvae import MP4Piece
from streamvae.server import create_app
from streamvae.server._hls import HLSTiming
from streamvae.server._videos import VideoRegistry
from tests._c2pa import GENERATED, XMP_UUID, HungKMS, SigningChain, make_chain, read_manifest
from tests._media import count_frames, wan_like_chunks, written_pieces
from tests._websocket import HANG, connect

pytestmark = pytest.mark.anyio

FRAMES = 17
SIZE = 32


@pytest.fixture(scope="module")
def chain() -> SigningChain:
    return make_chain()


def client_of(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=HANG)


def detached_state(data: bytes, manifest: bytes, chain: SigningChain) -> str:
    """The validation state of ``data`` against its detached manifest, the tests' CA trusted."""
    return str(read_manifest(data, trust=chain.ca, detached=manifest)["validation_state"])


def created(manifest: dict[str, Any]) -> dict[str, Any]:
    active = manifest["manifests"][manifest["active_manifest"]]
    (actions,) = [a for a in active["assertions"] if a["label"].startswith("c2pa.actions")]
    (action,) = [a for a in actions["data"]["actions"] if a["action"] == "c2pa.created"]
    return dict(action)


def init_segment(data: bytes) -> bytes:
    return data[: data.index(b"moof") - 4]


async def test_a_video_mp4_stream_is_marked_and_its_replay_signed(
    chain: SigningChain, tmp_path: Path
) -> None:
    app = create_app(session_options={"provenance": chain.provenance()}, recording_dir=tmp_path)
    async with client_of(app) as http:
        owner = await http.get(f"/video.mp4?frames={FRAMES}&size={SIZE}")
        assert owner.status_code == 200
        streamed = owner.content
        assert XMP_UUID in init_segment(streamed)  # the unsigned mark, where FFmpeg reads it
        assert c2pa.Reader.try_create("video/mp4", io.BytesIO(streamed)) is None  # sent: not signed
        video_id = owner.headers["link"].split("/")[3]
        base = f"/v1/videos/{video_id}"
        assert (
            f'<{base}/manifest.c2pa>; rel="c2pa-manifest"; type="application/c2pa"' in owner.headers["link"]
        )
        replay = (await http.get(f"{base}/video.mp4")).content
        manifest = await http.get(f"{base}/manifest.c2pa")
        assert manifest.status_code == 200 and manifest.headers["content-type"] == "application/c2pa"
    signed = read_manifest(replay, trust=chain.ca)
    assert signed["validation_state"] == "Trusted"
    assert created(signed)["digitalSourceType"] == GENERATED
    assert count_frames(replay) == FRAMES == count_frames(streamed)
    assert detached_state(streamed, manifest.content, chain) == "Trusted"  # the bytes the client got
    changed = bytearray(streamed)
    changed[-400] ^= 0xFF  # in the last mdat
    assert detached_state(bytes(changed), manifest.content, chain) == "Invalid"
    assert (tmp_path / video_id / "video.mp4").read_bytes() == replay
    assert XMP_UUID in (tmp_path / video_id / "init.mp4").read_bytes()


async def test_session_done_says_where_the_credentials_are(chain: SigningChain) -> None:
    app = create_app(session_options={"provenance": chain.provenance()})
    async with connect(app) as owner:
        await owner.send_json({"type": "session.start", "format": "m4s"})
        start = await owner.receive_json()
        assert start["type"] == "video.start"
        pieces, done = await owner.receive_until_done()
    streamed = b"".join(data for _, data in pieces)
    base = f"/v1/videos/{start['video_id']}"
    assert done["content_credentials"] == {
        "manifest": f"{base}/manifest.c2pa",
        "recording": f"{base}/video.mp4",
    }
    assert XMP_UUID in init_segment(streamed)
    async with client_of(app) as http:
        manifest = (await http.get(done["content_credentials"]["manifest"])).content
        replay = (await http.get(done["content_credentials"]["recording"])).content
    assert detached_state(streamed, manifest, chain) == "Trusted"
    assert read_manifest(replay, trust=chain.ca)["validation_state"] == "Trusted"
    assert count_frames(replay) == count_frames(streamed) > 0


async def test_without_provenance_no_mark_no_credentials() -> None:
    app = create_app()
    async with client_of(app) as http:
        owner = await http.get(f"/video.mp4?frames={FRAMES}&size={SIZE}")
        assert XMP_UUID not in owner.content
        assert "c2pa-manifest" not in owner.headers["link"]
        base = f"/v1/videos/{owner.headers['link'].split('/')[3]}"
        assert (await http.get(f"{base}/manifest.c2pa")).status_code == 404
        assert (await http.get(f"{base}/video.mp4")).content == owner.content
    async with connect(app) as client:
        await client.send_json({"type": "session.start"})
        assert (await client.receive_json())["type"] == "video.start"
        _, done = await client.receive_until_done()
    assert "content_credentials" not in done


# -- a signer that hangs --


async def ended_video(
    chain: SigningChain, tmp_path: Path, *, sign_timeout: float
) -> tuple[VideoRegistry, HungKMS, list[MP4Piece]]:
    kms = HungKMS(chain, wait=HANG)
    registry = VideoRegistry(
        timing=HLSTiming(part_target=Fraction(1, 4), target_duration=1, part_hold_back=Fraction(3, 4)),
        keep_videos=4,
        keep_bytes=1 << 26,
        recording_dir=tmp_path,
        stall_timeout=HANG,
        provenance=kms.provenance(),
        sign_timeout=sign_timeout,
    )
    pieces = await written_pieces(
        wan_like_chunks(3, height=32, width=48), value_range=(-1, 1), fps=16, output="fragmented"
    )
    return registry, kms, pieces


async def test_a_hung_signer_holds_no_viewer_and_the_signed_copy_is_swapped_in_after(
    chain: SigningChain, tmp_path: Path
) -> None:
    registry, kms, pieces = await ended_video(chain, tmp_path, sign_timeout=HANG)
    video = registry.open()
    for piece in pieces:
        video.broadcast.publish(piece)
    streamed = video.broadcast.mp4_bytes()
    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as group, video.broadcast.viewer(live_edge=False) as viewer:
            group.start_soon(registry.end, video)
            seen = b"".join([data async for data in viewer])  # ends while the KMS still hangs
            assert video.broadcast.state == "ended" and not kms.done.is_set()
            assert video.signed is None and video.credentials() is None
            kms.release.set()
    assert seen == streamed
    assert video.signed is not None and video.manifest is not None
    assert read_manifest(video.signed, trust=chain.ca)["validation_state"] == "Trusted"
    assert detached_state(streamed, video.manifest, chain) == "Trusted"
    assert (tmp_path / video.id / "video.mp4").read_bytes() == video.signed


async def test_a_signer_past_its_time_leaves_the_replay_unsigned_and_says_so(
    chain: SigningChain, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry, kms, pieces = await ended_video(chain, tmp_path, sign_timeout=0.2)
    video = registry.open()
    for piece in pieces:
        video.broadcast.publish(piece)
    with caplog.at_level(logging.ERROR, logger="streamvae.server"), anyio.fail_after(HANG):
        await registry.end(video)
    assert video.broadcast.state == "ended" and video.signed is None and video.credentials() is None
    assert f"signing video {video.id}'s recording took over 0.2 seconds" in caplog.text
    recording = (tmp_path / video.id / "video.mp4").read_bytes()
    assert recording == video.broadcast.mp4_bytes()
    assert c2pa.Reader.try_create("video/mp4", io.BytesIO(recording)) is None
    kms.release.set()  # the abandoned signature ends; what it makes is dropped
    await anyio.to_thread.run_sync(kms.done.wait, HANG)
    assert video.signed is None
