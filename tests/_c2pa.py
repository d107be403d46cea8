"""A test certificate chain for Content Credentials: a CA and an ES256 end-entity certificate it issued.

Made with ``cryptography`` as C2PA wants one (FACTS: a CA with basicConstraints CA and keyCertSign; an
end-entity certificate with CA false, digitalSignature, the emailProtection extended key usage, and
subject / authority key identifiers). The CA is what a test gives ``c2pa.Reader`` as its trust anchor to
see the signature as Trusted; ``valid_days`` and ``start`` make an expired (or not yet valid) one.
"""

from __future__ import annotations

import datetime
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import c2pa
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from streamvae import Provenance

#: IPTC's digital source type of a model's output, what streamvae's c2pa.created action and XMP say
GENERATED = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
#: the extended type of the uuid box that carries XMP in an MP4 (the unsigned mark of a streamed video)
XMP_UUID = bytes.fromhex("BE7ACFCB97A942E89C71999491E3AFAC")


@dataclass(frozen=True)
class SigningChain:
    """PEM bytes: the end-entity certificate then the CA's (what ``certificate_chain=`` takes), its key,
    and the CA alone (the trust anchor)."""

    certificate_chain: bytes
    private_key: bytes
    ca: bytes

    def write(self, directory: Path) -> tuple[Path, Path]:
        """The chain and the key as files in ``directory``: (chain.pem, key.pem)."""
        chain, key = directory / "chain.pem", directory / "key.pem"
        chain.write_bytes(self.certificate_chain)
        key.write_bytes(self.private_key)
        return chain, key

    def provenance(self) -> Provenance:
        """What streamvae signs with this chain: ``Provenance`` of its certificates and key."""
        return Provenance(certificate_chain=self.certificate_chain, private_key=self.private_key)


class HungKMS:
    """A KMS's ES256 sign call (``sign_with=``) that, once :attr:`hang` is set, sets :attr:`entered` and
    waits for :attr:`release` (at most ``wait`` seconds) before it signs; :attr:`done` once such a call
    has signed. ``hang`` is set by :meth:`provenance`, after the trial signature."""

    def __init__(self, chain: SigningChain, *, wait: float = 120.0) -> None:
        key = serialization.load_pem_private_key(chain.private_key, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self._key, self._chain, self._wait = key, chain, wait
        self.hang, self.entered = threading.Event(), threading.Event()
        self.release, self.done = threading.Event(), threading.Event()

    def provenance(self) -> Provenance:
        provenance = Provenance(certificate_chain=self._chain.certificate_chain, sign_with=self)
        self.hang.set()
        return provenance

    def __call__(self, data: bytes) -> bytes:
        hung = self.hang.is_set()
        if hung:
            self.entered.set()
            self.release.wait(self._wait)
        r, s = decode_dss_signature(self._key.sign(data, ec.ECDSA(hashes.SHA256())))
        if hung:
            self.done.set()
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "streamvae tests"),
        ]
    )


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures, and for a CA certificates and CRLs too (RFC 5280: keyCertSign needs CA true)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def make_chain(
    *,
    valid_days: int = 30,
    start: datetime.datetime | None = None,
    common_name: str = "streamvae test signer",
) -> SigningChain:
    """A fresh CA and an ES256 end-entity certificate valid from ``start`` (default: a day ago) for
    ``valid_days`` days."""
    now = datetime.datetime.now(datetime.UTC)
    start = now - datetime.timedelta(days=1) if start is None else start
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("streamvae test CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return SigningChain(_pem(leaf) + _pem(ca), key_pem, _pem(ca))


def read_manifest(
    data: bytes, *, trust: bytes | None = None, detached: bytes | None = None
) -> dict[str, Any]:
    """The C2PA store of an MP4 as ``c2pa.Reader`` reads it (``trust``: a PEM trust anchor; ``detached``:
    the store itself, a manifest served beside the MP4 rather than inside it), as a dict."""
    import io

    context = None
    if trust is not None:
        context = c2pa.Context.from_dict({"trust": {"trust_anchors": trust.decode()}})
    reader = c2pa.Reader("video/mp4", io.BytesIO(data), detached, context=context)
    try:
        return dict(json.loads(reader.json()))
    finally:
        reader.close()
