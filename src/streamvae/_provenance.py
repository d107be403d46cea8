"""Content Credentials: every complete output says, verifiably, that it was generated.

:class:`Provenance` is the session option (``provenance=``) that signs each complete MP4 streamvae
writes — the bytes a call returns, each output file, a broadcast's recording — with a C2PA manifest
(c2pa-python, the ``provenance`` extra). The manifest holds a ``c2pa.actions`` assertion whose
``c2pa.created`` action carries the IPTC digital source type ``trainedAlgorithmicMedia`` (what the EU AI
Act's Article 50 asks for: a machine-readable mark that the video was generated), the software agent
(streamvae and its version, and the diffusers pipeline where streamvae ran it) and any assertions of the
user's. The MP4 is covered by C2PA's BMFF hash, fragmented or not.

Bytes already sent cannot be signed after the fact, and no released C2PA library signs live fragments:
a stream carries the unsigned XMP mark of ``_xmp`` in its init segment instead, and its recording is
signed once it ends, with a detached manifest (:meth:`Provenance.detached`) that verifies the bytes
exactly as they were sent.

c2pa-rs 0.91 writes every entry of a fragmented MP4's fragment index (``mfra``/``tfra``) with the last
fragment's offset; the index is outside C2PA's BMFF hash, so :func:`_repair_fragment_index` writes the
source's back, moved by what signing inserted, and the signature still holds.

A signer that cannot sign is found at the door: the chain and key are read and matched with
``cryptography`` (the reasons a user can act on: not a certificate, not a key, a key that is not the
certificate's, a certificate outside its validity dates), then a trial signature of a tiny asset catches
the rest (c2pa's ``Signer.from_info`` accepts a mismatched key and an expired certificate; only signing
fails on them). A failure while signing real output is a :class:`streamvae.SigningError`, chained to the
cause.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from streamvae._boxes import file_boxes
from streamvae._errors import SigningError
from streamvae._public import public
from streamvae._xmp import DIGITAL_SOURCE_TYPE, shift_fragment_index, streamvae_version

if TYPE_CHECKING:
    import c2pa

__all__ = ["Provenance", "check_provenance"]

_ALGORITHMS = ("es256", "es384", "es512", "ps256", "ps384", "ps512", "ed25519")
_MP4 = "video/mp4"
# The smallest asset c2pa signs: the trial signature that proves a chain, a key and an algorithm sign.
_TRIAL_ASSET = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'
_TRIAL_FORMAT = "image/svg+xml"
_OWNER = "provenance"


def _pem(value: object, name: str) -> bytes:
    """PEM bytes as given (``bytes``, or a ``str`` of PEM text), or read from a path (``str``, ``PathLike``).

    A message never repeats the value: it may be a private key.
    """
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode("ascii", errors="replace")
    if isinstance(value, (str, os.PathLike)):
        try:
            return Path(value).read_bytes()
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else "not a usable path"
            # A str is not repeated: it may be key text that lost its "-----BEGIN" line.
            where = f"from {os.fspath(value)!r}" if isinstance(value, os.PathLike) else "as a path"
            raise ValueError(
                f"{_OWNER}: {name} must be PEM text (starting with '-----BEGIN') or the path of a PEM "
                f"file; it could not be read {where}: {reason}"
            ) from None
    raise ValueError(
        f"{_OWNER}: {name} must be PEM bytes or the path of a PEM file, got {type(value).__name__}"
    )


@public
@dataclasses.dataclass(frozen=True, eq=False)
class Provenance:
    """Content Credentials for every complete output: the ``provenance=`` session option.

    Built from a PEM certificate chain (the signing certificate first, then its issuers) and its PEM
    private key, each as bytes, as PEM text (a ``str`` starting ``-----BEGIN``) or as the path of a file::

        Provenance(certificate_chain="chain.pem", private_key="key.pem")

    with ``algorithm`` (``"es256"``, the default; ``es384``, ``es512``, ``ps256``…, ``ed25519``) and an
    optional RFC 3161 ``timestamp_url``. A key held in a KMS or an HSM signs through ``sign_with``, a
    function of the bytes to sign that returns the signature (ES256: the raw ``r || s``), in place of
    ``private_key``: ``Provenance(certificate_chain="chain.pem", sign_with=kms_sign)``; what it raises is
    the cause of the :class:`streamvae.SigningError`. Or around a ``c2pa.Signer`` you built yourself:
    ``Provenance(signer=signer)``, alone: its algorithm and timestamp server are the signer's (c2pa then
    reports a failing callback only as an invalid signature).

    ``assertions``: extra C2PA assertions for every manifest, each a dict with ``label`` and ``data``
    (``{"label": "com.example.job", "data": {"id": "42"}}``).

    Built, it has been checked: a chain, key or algorithm that cannot sign is a ValueError naming
    ``provenance`` and the reason — not a certificate, not a key, a key that is not the certificate's, a
    certificate outside its validity dates — found with a trial signature of a tiny asset, before any
    decode. Needs the ``provenance`` extra (``pip install streamvae[provenance]``).

    What is signed: the MP4 a session returns, a plain MP4's one streamed piece, and every regular file
    among ``output_files`` (a device or a FIFO there is refused: written as the bytes come, it could not be
    signed once they are all there). Not signed: a fragmented stream (sent before it ends: it carries the
    unsigned XMP mark).
    """

    certificate_chain: bytes | str | os.PathLike[str] | None = dataclasses.field(default=None, repr=False)
    private_key: bytes | str | os.PathLike[str] | None = dataclasses.field(default=None, repr=False)
    algorithm: str = "es256"
    timestamp_url: str | None = None
    assertions: Sequence[Mapping[str, Any]] = ()
    signer: c2pa.Signer | None = None
    sign_with: Callable[[bytes], bytes] | None = None
    #: the diffusers pipeline class streamvae ran (set by ``generate_mp4`` / ``stream_generation``)
    pipeline: str | None = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        fix = self._set
        try:
            import c2pa  # noqa: F401  # the extra is there: say so now, not at the first output
        except ImportError:
            raise ImportError(
                f"{_OWNER}: Content Credentials need c2pa-python: pip install 'streamvae[provenance]'"
            ) from None
        if self.signer is not None:
            if any(given is not None for given in (self.certificate_chain, self.private_key, self.sign_with)):
                raise ValueError(
                    f"{_OWNER}: pass signer= alone, or certificate_chain= with private_key= or sign_with= "
                    "(a signer holds its own certificates and key)"
                )
            # The default algorithm is all one can say of one not given (a dataclass field has no unset).
            if self.algorithm != "es256" or self.timestamp_url is not None:
                raise ValueError(
                    f"{_OWNER}: algorithm= and timestamp_url= do not go with signer= (a c2pa.Signer is built "
                    "with its own algorithm and timestamp server), got "
                    f"algorithm={self.algorithm!r}, timestamp_url={self.timestamp_url!r}"
                )
            if not _is_signer(self.signer):
                raise TypeError(f"{_OWNER}: signer must be a c2pa.Signer, got {type(self.signer).__name__}")
        else:
            if self.certificate_chain is None or (self.private_key is None) == (self.sign_with is None):
                raise ValueError(
                    f"{_OWNER}: needs certificate_chain= (PEM bytes or a path) with one of private_key= (PEM "
                    "bytes or a path) or sign_with= (a function that signs with a key held elsewhere), or "
                    "signer="
                )
            if self.sign_with is not None and not callable(self.sign_with):
                raise TypeError(
                    f"{_OWNER}: sign_with must be a function of the bytes to sign, got "
                    f"{type(self.sign_with).__name__}"
                )
            fix("certificate_chain", _pem(self.certificate_chain, "certificate_chain"))
            if self.private_key is not None:
                fix("private_key", _pem(self.private_key, "private_key"))
            if self.algorithm not in _ALGORITHMS:
                raise ValueError(
                    f"{_OWNER}: algorithm must be one of {', '.join(_ALGORITHMS)}, got {self.algorithm!r}"
                )
            if self.timestamp_url is not None and (
                not isinstance(self.timestamp_url, str)
                or not self.timestamp_url.startswith(("http://", "https://"))
            ):
                raise ValueError(
                    f"{_OWNER}: timestamp_url must be an http(s) URL or None, got {self.timestamp_url!r}"
                )
            assert isinstance(self.certificate_chain, bytes)
            if isinstance(self.private_key, bytes):
                _check_credentials(self.certificate_chain, self.private_key)
            else:
                _check_dates(_certificates(self.certificate_chain)[0])
        fix("assertions", _check_assertions(self.assertions))
        try:
            self._signed(_TRIAL_ASSET, _TRIAL_FORMAT)
        except Exception as error:
            raise ValueError(f"{_OWNER}: a trial signature failed: {error}") from error

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # normalizing a frozen value while it is built

    def ran(self, pipeline: str) -> Provenance:
        """These credentials, saying that streamvae ran the diffusers pipeline ``pipeline`` (a class name).
        The same signer: no second trial."""
        copy = object.__new__(Provenance)
        for field in dataclasses.fields(self):
            object.__setattr__(copy, field.name, getattr(self, field.name))
        object.__setattr__(copy, "pipeline", pipeline)
        return copy

    def manifest(self) -> dict[str, Any]:
        """The manifest definition every output gets (what c2pa's ``Builder`` takes)."""
        agent = {"name": "streamvae", "version": streamvae_version()}
        action: dict[str, Any] = {
            "action": "c2pa.created",
            "digitalSourceType": DIGITAL_SOURCE_TYPE,
            "softwareAgent": agent,
        }
        if self.pipeline is not None:
            import diffusers

            action["parameters"] = {"pipeline": f"diffusers {diffusers.__version__} {self.pipeline}"}
            action["description"] = f"generated by diffusers' {self.pipeline}, encoded by streamvae"
        actions = {"label": "c2pa.actions", "data": {"actions": [action]}}
        return {
            "claim_generator_info": [agent],
            "assertions": [actions, *(dict(assertion) for assertion in self.assertions)],
        }

    def check_current(self) -> None:
        """Raise the door's ValueError if the signing certificate is outside its validity dates now (a
        ``Provenance`` built yesterday may hold one that expired since). A ``signer``'s are its own."""
        if self.signer is None:
            assert isinstance(self.certificate_chain, bytes)
            _check_dates(_certificates(self.certificate_chain)[0])

    # -- signing (worker threads) --

    def sign(self, data: bytes, *, what: str) -> bytes:
        """``data`` (a complete MP4) with its Content Credentials embedded; :class:`SigningError` naming
        ``what`` (``"entry 0's MP4"``), chained to the cause, if signing fails."""
        try:
            return self._signed(data, _MP4)
        except Exception as error:
            raise SigningError(f"signing {what} failed: {type(error).__name__}: {error}") from error

    def detached(self, data: bytes, *, what: str) -> bytes:
        """A manifest store (a ``.c2pa`` sidecar) for ``data`` exactly as it is: what a stream's bytes,
        sent before they could be signed, are verified against once the stream has ended
        (``c2pa.Reader("video/mp4", stream, manifest_data)``). :class:`SigningError` as :meth:`sign`."""
        import c2pa

        try:
            builder = c2pa.Builder(json.dumps(self.manifest()))
            try:
                builder.set_no_embed()
                manifest: list[bytes] = []
                self._with_signer(
                    lambda signer: manifest.append(builder.sign(signer, _MP4, io.BytesIO(data), io.BytesIO()))
                )
            finally:
                builder.close()
        except Exception as error:
            raise SigningError(f"signing {what} failed: {type(error).__name__}: {error}") from error
        return manifest[0]

    def sign_file(self, source: Path, destination: Path, *, what: str) -> None:
        """Write ``source`` (a complete MP4), signed, to ``destination``; :class:`SigningError` as
        :meth:`sign`. Streams both files: a long video is never held in memory."""
        import c2pa

        try:
            with open(source, "rb") as reader, open(destination, "w+b") as writer:
                builder = c2pa.Builder(json.dumps(self.manifest()))
                try:
                    self._with_signer(lambda signer: builder.sign(signer, _MP4, reader, writer))
                finally:
                    builder.close()
                _repair_fragment_index(reader, writer)
        except Exception as error:
            raise SigningError(f"signing {what} failed: {type(error).__name__}: {error}") from error

    def _signed(self, data: bytes, format: str) -> bytes:
        import c2pa

        source, out = io.BytesIO(data), io.BytesIO()
        builder = c2pa.Builder(json.dumps(self.manifest()))
        try:
            self._with_signer(lambda signer: builder.sign(signer, format, source, out))
        finally:
            builder.close()
        if format == _MP4:
            _repair_fragment_index(source, out)
        return out.getvalue()

    def _with_signer(self, sign: Any) -> None:
        """Run ``sign(signer)``: a signer made afresh from the chain and the key or ``sign_with`` (one per
        signature, so entries sign side by side), or the user's, one signature at a time. ``sign_with``'s
        own exception is raised in place of c2pa's "invalid signature"."""
        import c2pa

        if self.signer is not None:
            with self._lock:
                sign(self.signer)
            return
        assert isinstance(self.certificate_chain, bytes)
        timestamp_url = self.timestamp_url
        failures: list[Exception] = []
        if self.sign_with is not None:
            sign_with = self.sign_with

            def callback(data: bytes) -> bytes:
                try:
                    return sign_with(data)
                except Exception as error:
                    failures.append(error)
                    raise

            algorithm = c2pa.C2paSigningAlg[self.algorithm.upper()]
            signer = c2pa.Signer.from_callback(
                callback, algorithm, self.certificate_chain.decode(), timestamp_url
            )
        else:
            assert isinstance(self.private_key, bytes)
            info = c2pa.C2paSignerInfo(
                alg=self.algorithm.encode(),
                sign_cert=self.certificate_chain,
                private_key=self.private_key,
                ta_url=None if timestamp_url is None else timestamp_url.encode(),
            )
            signer = c2pa.Signer.from_info(info)
        try:
            sign(signer)
        except Exception:
            if failures:
                # The function's own error, its own cause kept; c2pa's "invalid signature" is its context.
                raise failures[0]  # noqa: B904
            raise
        finally:
            signer.close()


def _repair_fragment_index(source: BinaryIO, signed: BinaryIO) -> None:
    """Put the fragment index (``mfra``) of a signed fragmented MP4 right: the source's, its ``moof``
    offsets moved by what signing inserted before the fragments.

    c2pa-rs 0.91 (c2pa-python 0.38) writes every ``tfra`` entry with the last fragment's offset; the
    ``mfra`` is outside the BMFF hash (C2PA excludes it), so mending it keeps the signature valid. A file
    without an ``mfra`` (a plain MP4), or one whose index changed size, is left as it is.
    """
    before, after = file_boxes(source), file_boxes(signed)
    moof_before = next((offset for kind, offset, _ in before if kind == b"moof"), None)
    moof_after = next((offset for kind, offset, _ in after if kind == b"moof"), None)
    mfra_before = next(((offset, size) for kind, offset, size in before if kind == b"mfra"), None)
    mfra_after = next(((offset, size) for kind, offset, size in after if kind == b"mfra"), None)
    if moof_before is None or moof_after is None or mfra_before is None or mfra_after is None:
        return
    if mfra_before[1] != mfra_after[1]:
        return
    source.seek(mfra_before[0])
    index = shift_fragment_index(source.read(mfra_before[1]), moof_after - moof_before)
    signed.seek(mfra_after[0])
    signed.write(index)
    signed.flush()


def _is_signer(value: object) -> bool:
    import c2pa

    return isinstance(value, c2pa.Signer)


def check_provenance(value: object) -> Provenance | None:
    """``value`` if it is None or a :class:`Provenance` whose certificate is valid now; a TypeError for
    anything else, the ValueError of :meth:`Provenance.check_current` for an expired certificate."""
    if value is None:
        return None
    if not isinstance(value, Provenance):
        raise TypeError(
            f"{_OWNER} must be a streamvae.Provenance (a certificate chain and key, or a c2pa.Signer) or "
            f"None, got {type(value).__name__}"
        )
    value.check_current()
    return value


# -- the credentials, read with cryptography --


def _certificates(chain: bytes) -> list[Any]:
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(chain)
    except ValueError as error:
        raise ValueError(f"{_OWNER}: certificate_chain is not a PEM certificate chain ({error})") from None
    return list(certificates)


def _check_dates(certificate: Any) -> None:
    now = datetime.datetime.now(datetime.UTC)
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    if not start <= now <= end:
        raise ValueError(
            f"{_OWNER}: the signing certificate is valid from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} "
            f"UTC, not now ({now:%Y-%m-%d %H:%M} UTC)"
        )


def _check_credentials(chain: bytes, key: bytes) -> None:
    """The reasons a chain and key cannot sign that a user can act on, each a ValueError."""
    from cryptography.hazmat.primitives import serialization

    certificate = _certificates(chain)[0]
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{_OWNER}: private_key is not an unencrypted PEM private key ({error})") from None
    public_bytes = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if private.public_key().public_bytes(der, public_bytes) != certificate.public_key().public_bytes(
        der, public_bytes
    ):
        raise ValueError(
            f"{_OWNER}: private_key does not match the signing certificate (the first of certificate_chain, "
            f"{certificate.subject.rfc4514_string()})"
        )
    _check_dates(certificate)


def _check_assertions(assertions: object) -> tuple[dict[str, Any], ...]:
    if isinstance(assertions, (str, bytes, Mapping)) or not isinstance(assertions, Sequence):
        raise ValueError(
            f"{_OWNER}: assertions must be a sequence of {{'label': ..., 'data': ...}} dicts, "
            f"got {assertions!r}"
        )
    checked = []
    for index, assertion in enumerate(assertions):
        if (
            not isinstance(assertion, Mapping)
            or not isinstance(assertion.get("label"), str)
            or "data" not in assertion
        ):
            raise ValueError(
                f"{_OWNER}: assertions[{index}] must be a dict with a str 'label' and its 'data', "
                f"got {assertion!r}"
            )
        try:
            json.dumps(assertion)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{_OWNER}: assertions[{index}] is not JSON ({error})") from None
        checked.append(dict(assertion))
    return tuple(checked)
