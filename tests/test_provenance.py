"""Content Credentials: every complete output is signed and says it was generated; every stream is marked.

Each signed output is read back with c2pa's own Reader (Valid; Trusted with the tests' CA as the trust
anchor; the ``c2pa.created`` action with the digital source type) and decoded with PyAV, every frame.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import struct
import threading
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import av
import c2pa
import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

import streamvae
from streamvae import ChunkedVideoMP4Session, Provenance, SigningError, decode_to_mp4
from streamvae._encode import EntryEncoder
from tests._c2pa import GENERATED, XMP_UUID, HungKMS, SigningChain, make_chain, read_manifest
from tests._media import count_frames, top_level_boxes, wan_like_chunks, written_pieces
from tests._vaes import latent, tiny_wan21

pytestmark = pytest.mark.anyio

SIZE = {"height": 32, "width": 48}
FRAMES = 9  # wan_like_chunks(3): 1 + 4 * 2


@pytest.fixture(scope="module")
def chain() -> SigningChain:
    return make_chain()


@pytest.fixture(scope="module")
def provenance(chain: SigningChain) -> Provenance:
    return chain.provenance()


def created_actions(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    active = manifest["manifests"][manifest["active_manifest"]]
    actions = [a for a in active["assertions"] if a["label"].startswith("c2pa.actions")]
    return [action for a in actions for action in a["data"]["actions"] if action["action"] == "c2pa.created"]


def assert_signed(data: bytes, chain: SigningChain, *, frames: int = FRAMES) -> dict[str, Any]:
    """Valid without a trust anchor, Trusted with the tests' CA, created by a model, every frame there."""
    untrusted = read_manifest(data)
    assert untrusted["validation_state"] == "Valid"
    manifest = read_manifest(data, trust=chain.ca)
    assert manifest["validation_state"] == "Trusted"
    (created,) = created_actions(manifest)
    assert created["digitalSourceType"] == GENERATED
    assert created["softwareAgent"]["name"] == "streamvae"
    assert created["softwareAgent"]["version"] == streamvae.__version__
    assert count_frames(data) == frames
    return manifest


async def render(**options: Any) -> list[bytes]:
    async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, **options) as session:
        for chunk in wan_like_chunks(3, **SIZE):
            await session.push(chunk)
        return await session.finish()


# -- every complete output is signed --


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
async def test_decode_to_mp4_bytes_and_output_files_are_signed(
    output: str, provenance: Provenance, chain: SigningChain, tmp_path: Path
) -> None:
    vae = tiny_wan21()
    z = latent(vae, batch=2, frames=3)
    files = [tmp_path / "a.mp4", tmp_path / "b.mp4"]
    videos = await decode_to_mp4(vae, z, fps=16, output=output, output_files=files, provenance=provenance)
    for data, path in zip(videos, files, strict=True):
        assert_signed(data, chain)
        assert_signed(path.read_bytes(), chain)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4", "b.mp4"]  # no temporary left


async def test_signed_fragmented_mp4_keeps_its_fragment_index(provenance: Provenance) -> None:
    """Every ``tfra`` entry points at a ``moof`` of the signed file (c2pa-rs alone writes the last one's)."""
    (data,) = await render(output="fragmented", provenance=provenance)
    boxes = top_level_boxes(data)
    moofs = [offset for kind, offset, _ in boxes if kind == b"moof"]
    ((mfra, _),) = [(offset, size) for kind, offset, size in boxes if kind == b"mfra"]
    body = mfra + 16  # mfra's header, then tfra's
    version, count = data[body], struct.unpack_from(">I", data, body + 12)[0]
    wide = 8 if version == 1 else 4
    offsets = [
        int.from_bytes(
            data[body + 16 + i * (2 * wide + 3) + wide : body + 16 + i * (2 * wide + 3) + 2 * wide]
        )
        for i in range(count)
    ]
    assert offsets and set(offsets) <= set(moofs)
    assert offsets == sorted(offsets) and len(set(offsets)) == count


async def test_one_changed_mdat_byte_makes_the_signature_invalid(
    provenance: Provenance, chain: SigningChain
) -> None:
    (data,) = await render(provenance=provenance)
    ((_, mdat, size),) = [box for box in top_level_boxes(data) if box[0] == b"mdat"]
    changed = bytearray(data)
    changed[mdat + size // 2] ^= 0xFF
    manifest = read_manifest(bytes(changed), trust=chain.ca)
    assert manifest["validation_state"] == "Invalid"
    failures = [status["code"] for status in manifest["validation_results"]["activeManifest"]["failure"]]
    assert "assertion.bmffHash.mismatch" in failures


async def test_without_provenance_nothing_is_signed_or_marked() -> None:
    (data,) = await render(output="fragmented")
    assert c2pa.Reader.try_create("video/mp4", io.BytesIO(data)) is None
    assert XMP_UUID not in data


# -- a signature that fails --


def kms_sign(chain: SigningChain, *, fail_after: int) -> Callable[[bytes], bytes]:
    """A KMS's sign call (ES256: raw r || s) that fails from its ``fail_after + 1``-th call."""
    key = serialization.load_pem_private_key(chain.private_key, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    calls = []

    def sign(data: bytes) -> bytes:
        calls.append(data)
        if len(calls) > fail_after:
            raise ConnectionError("the KMS is unreachable")
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    return sign


def kms(chain: SigningChain, *, fail_after: int) -> Provenance:
    return Provenance(
        certificate_chain=chain.certificate_chain, sign_with=kms_sign(chain, fail_after=fail_after)
    )


async def test_a_kms_signs_through_sign_with_or_a_c2pa_signer(chain: SigningChain) -> None:
    (data,) = await render(provenance=kms(chain, fail_after=10))
    assert_signed(data, chain)
    sign = kms_sign(chain, fail_after=10)
    signer = c2pa.Signer.from_callback(
        sign, c2pa.C2paSigningAlg.ES256, chain.certificate_chain.decode(), None
    )
    (data,) = await render(output="fragmented", provenance=Provenance(signer=signer))
    assert_signed(data, chain)
    for ignored in ({"algorithm": "es384"}, {"timestamp_url": "http://timestamp.example"}):
        with pytest.raises(
            ValueError, match="provenance: algorithm= and timestamp_url= do not go with signer="
        ):
            Provenance(signer=signer, **ignored)


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
async def test_a_failing_signature_keeps_the_old_file_and_says_signing_failed(
    output: str, chain: SigningChain, tmp_path: Path
) -> None:
    path = tmp_path / "out.mp4"
    path.write_bytes(b"an earlier render")
    failing = kms(chain, fail_after=1)  # the trial signature at the door passes
    with pytest.raises(SigningError, match="signing the output file .*out.mp4.* failed") as raised:
        await render(output=output, output_files=[path], provenance=failing)
    assert isinstance(raised.value.__cause__, ConnectionError)  # the KMS's own error
    assert path.read_bytes() == b"an earlier render"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4"]


async def test_a_failing_signature_of_the_bytes_fails_the_session(chain: SigningChain) -> None:
    failing = kms(chain, fail_after=1)
    with pytest.raises(SigningError, match="signing entry 0's MP4 failed: ConnectionError") as raised:
        await render(provenance=failing)
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert isinstance(raised.value.__cause__.__context__, c2pa.C2paError)


# -- checked at the door --


def test_a_key_that_is_not_the_certificates_is_refused(chain: SigningChain) -> None:
    other = make_chain()
    with pytest.raises(ValueError, match="provenance: private_key does not match the signing certificate"):
        Provenance(certificate_chain=chain.certificate_chain, private_key=other.private_key)


@pytest.mark.parametrize("days_ago", [40, -40])
def test_a_certificate_outside_its_dates_is_refused(days_ago: int) -> None:
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=days_ago)
    old = make_chain(start=start, valid_days=10)
    with pytest.raises(ValueError, match=r"provenance: the signing certificate is valid from .* not now"):
        Provenance(certificate_chain=old.certificate_chain, private_key=old.private_key)


def test_what_is_not_a_certificate_or_a_key_is_refused(chain: SigningChain, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="provenance: certificate_chain is not a PEM certificate chain"):
        Provenance(certificate_chain=b"not a certificate", private_key=chain.private_key)
    with pytest.raises(ValueError, match="provenance: private_key is not an unencrypted PEM private key"):
        Provenance(certificate_chain=chain.certificate_chain, private_key=chain.ca)
    with pytest.raises(
        ValueError, match="provenance: certificate_chain must be PEM text .* could not be read from"
    ):
        Provenance(certificate_chain=tmp_path / "missing.pem", private_key=chain.private_key)
    with pytest.raises(ValueError, match="provenance: algorithm must be one of"):
        Provenance(certificate_chain=chain.certificate_chain, private_key=chain.private_key, algorithm="md5")
    with pytest.raises(ValueError, match="provenance: a trial signature failed"):
        Provenance(
            certificate_chain=chain.certificate_chain, private_key=chain.private_key, algorithm="es384"
        )


def test_paths_are_read(chain: SigningChain, tmp_path: Path) -> None:
    chain_path, key_path = chain.write(tmp_path)
    provenance = Provenance(certificate_chain=str(chain_path), private_key=key_path)
    assert provenance.certificate_chain == chain.certificate_chain
    assert "PRIVATE KEY" not in repr(provenance)


def test_pem_text_is_taken_as_pem_and_never_repeated(chain: SigningChain) -> None:
    key = chain.private_key.decode()
    provenance = Provenance(certificate_chain=chain.certificate_chain.decode(), private_key=key)
    assert provenance.private_key == chain.private_key
    # Key text that lost its BEGIN line is taken as a path, and the message does not repeat it.
    body = key.split("\n", 1)[1]
    with pytest.raises(ValueError, match="provenance: private_key must be PEM text") as raised:
        Provenance(certificate_chain=chain.certificate_chain, private_key=body)
    assert body.strip().splitlines()[0] not in str(raised.value)
    assert "PRIVATE KEY" not in str(raised.value)


def test_a_fifo_among_the_output_files_is_refused_with_provenance_and_left_alone(
    provenance: Provenance, tmp_path: Path
) -> None:
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    with pytest.raises(
        ValueError, match=r"output_files\[1\] .*pipe\.mp4.* no regular file .* cannot be signed"
    ):
        ChunkedVideoMP4Session(
            value_range=(-1.0, 1.0), fps=16, output_files=[tmp_path / "a.mp4", fifo], provenance=provenance
        )
    ChunkedVideoMP4Session(value_range=(-1.0, 1.0), fps=16, output_files=[fifo])  # unsigned: taken
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.mp4"]  # nothing written, the FIFO kept


def test_the_session_option_takes_a_provenance_only(provenance: Provenance) -> None:
    with pytest.raises(TypeError, match=r"ChunkedVideoMP4Session: provenance must be a streamvae.Provenance"):
        ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, provenance="chain.pem")  # type: ignore[arg-type]
    options = streamvae.SessionOptions(value_range=(-1, 1), fps=16, provenance=provenance)
    assert dataclasses.replace(options, fps=8).provenance is provenance


async def test_extra_assertions_are_in_the_manifest(chain: SigningChain) -> None:
    job = {"label": "com.example.job", "data": {"id": "42"}}
    provenance = Provenance(
        certificate_chain=chain.certificate_chain, private_key=chain.private_key, assertions=[job]
    )
    (data,) = await render(provenance=provenance)
    manifest = assert_signed(data, chain)
    active = manifest["manifests"][manifest["active_manifest"]]
    assert {"label": "com.example.job", "data": {"id": "42"}} in active["assertions"]
    with pytest.raises(ValueError, match=r"provenance: assertions\[0\] must be a dict"):
        Provenance(certificate_chain=chain.certificate_chain, private_key=chain.private_key, assertions=["x"])


# -- a cancel while a KMS hangs --


@pytest.mark.parametrize("output", ["mp4", "fragmented"])
def test_a_close_while_the_file_is_signed_keeps_the_old_file(
    output: str, chain: SigningChain, tmp_path: Path
) -> None:
    """A cancelled session closes its encoder while finish() signs the file: the file is aborted, not
    put in place, once the signer returns."""
    path = tmp_path / "out.mp4"
    path.write_bytes(b"old")
    kms = HungKMS(chain)
    encoder = EntryEncoder(fps=Fraction(16), output=output, file=path, provenance=kms.provenance())  # type: ignore[arg-type]
    encoder.encode(np.zeros((FRAMES, 32, 48, 3), np.uint8))
    finishing = threading.Thread(target=encoder.finish)
    finishing.start()
    try:
        assert kms.entered.wait(60)
        encoder.close()  # what a cancel does: it never waits for the call in flight
        assert finishing.is_alive() and not kms.done.is_set()
    finally:
        kms.release.set()
        finishing.join(60)
    assert kms.done.is_set() and not finishing.is_alive()
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4"]  # no .part left


async def test_a_cancel_while_the_kms_hangs_leaves_at_once(chain: SigningChain) -> None:
    """The kept MP4 is signed in a thread a cancel abandons: the session does not wait for the KMS."""
    kms = HungKMS(chain)
    provenance = kms.provenance()

    async def cancel_once_signing(scope: anyio.CancelScope) -> None:
        await anyio.to_thread.run_sync(kms.entered.wait, 60, abandon_on_cancel=True)
        scope.cancel()

    try:
        with anyio.fail_after(60):
            async with ChunkedVideoMP4Session(value_range=(-1, 1), fps=16, provenance=provenance) as session:
                for chunk in wan_like_chunks(3, **SIZE):
                    await session.push(chunk)
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as group:
                        group.start_soon(cancel_once_signing, scope)
                        await session.finish()
            assert scope.cancelled_caught and not kms.done.is_set()  # left while the KMS still hung
    finally:
        kms.release.set()


# -- streams carry the unsigned mark --


def init_segment(pieces: list[streamvae.MP4Piece]) -> bytes:
    assert pieces[0].init_size > 0
    return pieces[0].data[: pieces[0].init_size]


@pytest.mark.parametrize("on", [True, False])
async def test_every_streams_init_segment_carries_the_xmp_mark_when_on(
    on: bool, provenance: Provenance
) -> None:
    options: dict[str, Any] = {
        "value_range": (-1, 1),
        "fps": 16,
        "output": "fragmented",
        "keyframe_interval": 4,
    }
    if on:
        options["provenance"] = provenance
    with anyio.fail_after(60):
        async with ChunkedVideoMP4Session(**options) as session:
            streams = [session.open_stream(entry) for entry in range(2)]

            async def produce() -> None:
                for chunk in wan_like_chunks(3, batch=2, **SIZE):
                    await session.push(chunk)
                await session.finish()

            session.start_producer(produce)
            pieces: list[list[streamvae.MP4Piece]] = [[], []]
            async for entry, piece in streamvae.read_entries(streams, pieces=True):
                pieces[entry].append(piece)
    for entry in pieces:
        init = init_segment(entry)
        kinds = [kind for kind, _, _ in top_level_boxes(init)]
        data = b"".join(piece.data for piece in entry)
        assert count_frames(data) == FRAMES
        with av.open(io.BytesIO(data), options={"export_xmp": "1"}) as container:
            xmp = container.metadata.get("xmp")
        if on:
            assert kinds == [b"ftyp", b"moov", b"uuid"]  # after the moov: where FFmpeg reads it
            assert init.index(XMP_UUID) == top_level_boxes(init)[2][1] + 8  # the uuid box is XMP's
            assert xmp is not None and GENERATED in xmp
        else:
            assert kinds == [b"ftyp", b"moov"]
            assert xmp is None


async def test_a_marked_streams_pieces_are_its_output_file(provenance: Provenance, tmp_path: Path) -> None:
    """The file of a streamed entry is the stream's bytes, marked, then signed: the mark is in both."""
    path = tmp_path / "out.mp4"
    pieces = await written_pieces(
        wan_like_chunks(3, **SIZE),
        value_range=(-1, 1),
        fps=16,
        output="fragmented",
        output_files=[path],
        provenance=provenance,
    )
    streamed = b"".join(piece.data for piece in pieces)
    assert XMP_UUID in init_segment(pieces)
    assert c2pa.Reader.try_create("video/mp4", io.BytesIO(streamed)) is None  # sent: unsigned
    signed = path.read_bytes()
    assert read_manifest(signed)["validation_state"] == "Valid"
    assert XMP_UUID in signed and count_frames(signed) == FRAMES


async def test_a_streamed_plain_mp4_is_signed_before_it_is_handed_on(
    provenance: Provenance, chain: SigningChain, tmp_path: Path
) -> None:
    """``output="mp4"`` streams one piece, the complete file: signed, like the output file beside it."""
    path = tmp_path / "out.mp4"
    pieces = await written_pieces(
        wan_like_chunks(3, **SIZE),
        value_range=(-1, 1),
        fps=16,
        output="mp4",
        output_files=[path],
        provenance=provenance,
    )
    (piece,) = pieces
    assert piece.frames == piece.frames_until == FRAMES and piece.keyframe
    assert_signed(piece.data, chain)
    assert_signed(path.read_bytes(), chain)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4"]


# -- a pipeline streamvae ran --


async def test_generate_mp4_names_the_pipeline_it_ran(provenance: Provenance, chain: SigningChain) -> None:
    from streamvae.pipelines import generate_mp4, stream_generation
    from tests.pipelines import CORE

    pipe, make_kwargs = CORE["wan21"]()
    (video,) = await generate_mp4(pipe, fps=8, session_options={"provenance": provenance}, **make_kwargs())
    frames = count_frames(video)
    manifest = assert_signed(video, chain, frames=frames)
    (created,) = created_actions(manifest)
    assert created["parameters"]["pipeline"].endswith(f" {type(pipe).__name__}")
    async with stream_generation(
        pipe, fps=8, session_options={"provenance": provenance}, **make_kwargs()
    ) as (stream,):
        streamed = b"".join([data async for data in stream])
    assert XMP_UUID in streamed and count_frames(streamed) == frames
