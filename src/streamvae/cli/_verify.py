"""``streamvae verify FILE.mp4``: whether a file carries valid Content Credentials, and what they say.

It prints three lines — the manifest's validation state, its signer, its actions — and exits 0 when the
signature is valid, whether or not its signer is trusted (the state line says which: a signer is trusted
only against a ``--trust-anchor`` CA certificate, since streamvae ships no trust list). A file without
Content Credentials, or whose credentials do not hold (a changed byte, a broken signature), is one
``streamvae: error: …`` line and exit status 1. It reads with c2pa-python, the validator streamvae signs
with; ``c2patool`` or the Content Authenticity Initiative's inspector say the same.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from streamvae._xmp import DIGITAL_SOURCE_TYPE
from streamvae.cli._inputs import CliError

__all__ = ["describe_manifest", "verify"]

# IPTC's digital source types (shown by their last part: trainedAlgorithmicMedia)
_IPTC = DIGITAL_SOURCE_TYPE.rpartition("/")[0] + "/"


def verify(args: argparse.Namespace) -> int:
    """Run ``streamvae verify``: print the three lines, or raise :class:`CliError`."""
    for line in describe_manifest(args.file, trust_anchor=args.trust_anchor):
        print(line)
    return 0


def describe_manifest(path: Path, *, trust_anchor: Path | None = None) -> list[str]:
    """The state, signer and actions lines of the file's active manifest; :class:`CliError` when the file
    cannot be read, is unsigned or its credentials are invalid."""
    try:
        import c2pa
    except ImportError as error:
        raise CliError(f"verify needs c2pa-python: pip install 'streamvae[provenance]' ({error})") from error
    context = None
    if trust_anchor is not None:
        try:
            anchors = trust_anchor.read_text()
        except OSError as error:
            raise CliError(f"--trust-anchor {trust_anchor}: {error.strerror}") from None
        try:
            context = c2pa.Context.from_dict({"trust": {"trust_anchors": anchors}})
        except c2pa.C2paError as error:
            raise CliError(
                f"--trust-anchor {trust_anchor}: not PEM CA certificates c2pa can read ({error})"
            ) from None
    try:
        with open(path, "rb") as file:
            reader = c2pa.Reader.try_create("video/mp4", file, context=context)
            if reader is None:
                raise CliError(f"{path} has no Content Credentials (no C2PA manifest)")
            try:
                store: dict[str, Any] = json.loads(reader.json())
            finally:
                reader.close()
    except OSError as error:
        raise CliError(f"{path}: {error.strerror}") from None
    except c2pa.C2paError as error:
        raise CliError(f"{path}: its Content Credentials cannot be read ({error})") from None
    state = store.get("validation_state")
    failures = [
        status["code"]
        for status in store.get("validation_results", {}).get("activeManifest", {}).get("failure", [])
    ]
    if state not in ("Valid", "Trusted"):
        reasons = (
            ", ".join(code for code in failures if code != "signingCredential.untrusted") or "no reason given"
        )
        raise CliError(f"{path}: its Content Credentials are {str(state).lower()}: {reasons}")
    manifest = store["manifests"][store["active_manifest"]]
    if state == "Trusted":
        trust = "the signer's certificate chains to the trust anchor"
    elif trust_anchor is None:
        trust = "not trusted: no --trust-anchor given to check the signer against"
    else:
        trust = f"not trusted: the signer's certificate does not chain to {trust_anchor}"
    return [f"state: {state} (signature valid; {trust})", _signer(manifest), _actions(manifest)]


def _signer(manifest: dict[str, Any]) -> str:
    info = manifest.get("signature_info", {})
    who = info.get("common_name") or "unnamed"
    # c2pa's "issuer" is the organization of the signing certificate's subject, not its CA
    issuer = f" ({info['issuer']})" if info.get("issuer") else ""
    alg = f", {info['alg']}" if info.get("alg") else ""
    when = f", signed {info['time']}" if info.get("time") else ""
    return f"signer: {who}{issuer}{alg}{when}"


def _actions(manifest: dict[str, Any]) -> str:
    described = []
    for assertion in manifest.get("assertions", []):
        if not str(assertion.get("label", "")).startswith("c2pa.actions"):
            continue
        for action in assertion.get("data", {}).get("actions", []):
            text = str(action.get("action"))
            source = str(action.get("digitalSourceType", ""))
            if source:
                text += f" ({source.removeprefix(_IPTC)})"
            agent = action.get("softwareAgent")
            if isinstance(agent, dict) and agent.get("name"):
                text += f" by {agent['name']} {agent.get('version', '')}".rstrip()
            pipeline = action.get("parameters", {}).get("pipeline")
            if pipeline:
                text += f" running {pipeline}"
            described.append(text)
    return f"actions: {'; '.join(described) or 'none'}"
