"""The command line's Content Credentials: ``demo`` and ``decode`` sign with ``--sign-cert`` /
``--sign-key``; ``verify`` says whether a file's credentials hold, trusted or not, and what they say."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pytest
import torch

from streamvae.cli import main
from tests._c2pa import SigningChain, make_chain, read_manifest
from tests._cli import one_line_error
from tests._media import count_frames
from tests._vaes import latent, tiny_wan21

FAST = ["--crf", "23", "--preset", "ultrafast", "--quiet"]
DEMO = ["--frames", "9", "--size", "32", *FAST]


@pytest.fixture(scope="module")
def chain() -> SigningChain:
    return make_chain()


@pytest.fixture
def signing(chain: SigningChain, tmp_path: Path) -> list[str]:
    certificate, key = chain.write(tmp_path)
    return ["--sign-cert", str(certificate), "--sign-key", str(key)]


@pytest.mark.parametrize(("container", "backend"), [("fragmented", "asyncio"), ("mp4", "trio")])
def test_demo_signs_and_verify_says_valid_untrusted_then_trusted(
    container: str,
    backend: str,
    chain: SigningChain,
    signing: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = tmp_path / "demo.mp4"
    assert (
        main(["demo", "-o", str(output), "--container", container, "--backend", backend, *DEMO, *signing])
        == 0
    )
    assert read_manifest(output.read_bytes(), trust=chain.ca)["validation_state"] == "Trusted"
    assert count_frames(output) == 9
    capsys.readouterr()
    assert main(["verify", str(output)]) == 0
    state, signer, actions = capsys.readouterr().out.splitlines()
    assert (
        state
        == "state: Valid (signature valid; not trusted: no --trust-anchor given to check the signer against)"
    )
    assert signer.startswith("signer: streamvae test signer (streamvae tests), Es256")
    assert actions.startswith("actions: c2pa.created (trainedAlgorithmicMedia) by streamvae ")
    anchor = tmp_path / "ca.pem"
    anchor.write_bytes(chain.ca)
    assert main(["verify", str(output), "--trust-anchor", str(anchor)]) == 0
    state, _, _ = capsys.readouterr().out.splitlines()
    assert state == "state: Trusted (signature valid; the signer's certificate chains to the trust anchor)"
    other = tmp_path / "other.pem"
    other.write_bytes(make_chain().ca)
    assert main(["verify", str(output), "--trust-anchor", str(other)]) == 0
    state, _, _ = capsys.readouterr().out.splitlines()
    assert (
        state
        == f"state: Valid (signature valid; not trusted: the signer's certificate does not chain to {other})"
    )


def test_decode_signs_every_output(chain: SigningChain, signing: list[str], tmp_path: Path) -> None:
    vae = tiny_wan21()
    directory = tmp_path / "vae"
    vae.save_pretrained(directory)
    latents = tmp_path / "z.pt"
    torch.save(latent(vae, batch=2, frames=2), latents)
    output = tmp_path / "out.mp4"
    assert main(["decode", str(latents), "--vae", str(directory), "-o", str(output), *FAST, *signing]) == 0
    for path in (tmp_path / "out-0.mp4", tmp_path / "out-1.mp4"):
        assert read_manifest(path.read_bytes(), trust=chain.ca)["validation_state"] == "Trusted"
        assert count_frames(path) == 5


def test_verify_refuses_an_unsigned_or_changed_file_in_one_line(
    signing: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unsigned = tmp_path / "unsigned.mp4"
    assert main(["demo", "-o", str(unsigned), *DEMO]) == 0
    capsys.readouterr()
    assert main(["verify", str(unsigned)]) == 1
    assert (
        one_line_error(capsys)
        == f"streamvae: error: {unsigned} has no Content Credentials (no C2PA manifest)\n"
    )
    signed = tmp_path / "signed.mp4"
    assert main(["demo", "-o", str(signed), "--container", "mp4", *DEMO, *signing]) == 0
    data = bytearray(signed.read_bytes())
    mdat = data.index(b"mdat")
    data[mdat + 200] ^= 0xFF
    changed = tmp_path / "changed.mp4"
    changed.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(changed)]) == 1
    error = one_line_error(capsys)
    assert error.startswith(f"streamvae: error: {changed}: its Content Credentials are invalid: ")
    assert "assertion.bmffHash.mismatch" in error
    assert main(["verify", str(tmp_path / "missing.mp4")]) == 1
    assert "No such file or directory" in one_line_error(capsys)


def test_a_certificate_that_cannot_sign_is_refused_before_anything_is_written(
    chain: SigningChain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expired = make_chain(
        start=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=40), valid_days=10
    )
    certificate, key = expired.write(tmp_path)
    output = tmp_path / "demo.mp4"
    output.write_bytes(b"an earlier render")
    assert (
        main(["demo", "-o", str(output), *DEMO, "--sign-cert", str(certificate), "--sign-key", str(key)]) == 1
    )
    assert "provenance: the signing certificate is valid from " in one_line_error(capsys)
    assert output.read_bytes() == b"an earlier render"
    written = {certificate.name, key.name, output.name}
    assert {path.name for path in tmp_path.iterdir()} == written  # no .part, no temporary file left
    assert main(["demo", "-o", str(output), *DEMO, "--sign-cert", str(certificate)]) == 1
    assert "--sign-cert and --sign-key go together" in one_line_error(capsys)


def test_a_missing_c2pa_is_one_line_for_signing_and_verifying(
    signing: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "c2pa", None)  # what `import c2pa` finds without the extra
    output = tmp_path / "demo.mp4"
    assert main(["demo", "-o", str(output), *DEMO, *signing]) == 1
    assert "--sign-cert needs c2pa-python: pip install 'streamvae[provenance]'" in one_line_error(capsys)
    assert not output.exists()
    assert main(["verify", str(output)]) == 1
    assert "verify needs c2pa-python" in one_line_error(capsys)


def test_a_trust_anchor_that_is_no_certificate_is_one_line(
    signing: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    signed = tmp_path / "signed.mp4"
    assert main(["demo", "-o", str(signed), "--container", "mp4", *DEMO, *signing]) == 0
    anchor = tmp_path / "anchor.pem"
    anchor.write_text("not a certificate\n")
    capsys.readouterr()
    assert main(["verify", str(signed), "--trust-anchor", str(anchor)]) == 1
    assert one_line_error(capsys).startswith(
        f"streamvae: error: --trust-anchor {anchor}: not PEM CA certificates"
    )
