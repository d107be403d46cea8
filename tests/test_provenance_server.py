"""Content Credentials on the server: every stream is marked, and once a generation ends complete its
replay is the recording signed, and the bytes as streamed verify against a detached manifest."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import c2pa
import httpx
import pytest
from starlette.applications import Starlette

from streamvae.server import create_app
from tests._c2pa import GENERATED, XMP_UUID, SigningChain, make_chain, read_manifest
from tests._media import count_frames
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
