"""The public surface: what users import stays importable, implementation modules are private by name,
and the old module paths still work for one release, with a warning."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import streamvae

DOCUMENTED = {
    "streamvae.models": [
        "ChunkedDecoder",
        "ProtocolDecoder",
        "as_decoder",
        "chunked_decoder",
        "supported_classes",
    ],
    "streamvae.distributed": [
        "PeerDecodeError",
        "ShardedDecodeStats",
        "ShardedWanDecoder",
        "init_distributed",
    ],
    "streamvae.server": ["ServerEvent", "ServerStats", "VideoRequest", "create_app", "serve"],
    "streamvae.cli": ["main", "load_latents", "load_vae", "run_decode"],
    "streamvae.demo": ["DEMO_FPS", "demo_latent", "demo_vae"],
    "streamvae.testing": ["check_chunked_decoder", "foreign_threads", "open_containers"],
}
DEPRECATED = {
    "streamvae.session": ["ChunkedVideoMP4Session", "MP4ByteStream", "SessionClosedError", "StageSpan"],
    "streamvae.encode": ["EntryEncoder", "open_containers", "as_fps"],
    "streamvae.quantize": ["quantize_chunk", "quantize_chunk_yuv420", "check_value_range"],
    "streamvae.transfer": ["PinnedChunkRing", "ChunkLease", "RingAbortedError", "host_lease"],
    "streamvae.decode": ["decode_to_mp4", "stream_mp4"],
    "streamvae.protocol": ["SupportsChunkedVAEDecode", "ChunkPublisher", "publish_chunks"],
}


def test_every_exported_name_is_importable_and_no_helper_is_exported() -> None:
    for name in streamvae.__all__:
        assert getattr(streamvae, name) is not None
    for helper in ("EntryEncoder", "merge_codec_options", "host_lease", "check_chunk", "check_int"):
        assert helper not in streamvae.__all__


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_the_documented_subpackages_export_their_names(module: str) -> None:
    imported = importlib.import_module(module)
    for name in DOCUMENTED[module]:
        assert name in imported.__all__ and getattr(imported, name) is not None


@pytest.mark.parametrize("module", sorted(DEPRECATED))
def test_an_old_module_path_still_works_and_warns(module: str) -> None:
    sys.modules.pop(module, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module(module)
    assert any(issubclass(w.category, DeprecationWarning) and module in str(w.message) for w in caught)
    private = importlib.import_module(module.replace("streamvae.", "streamvae._"))
    for name in DEPRECATED[module]:
        assert getattr(old, name) is getattr(private, name) or getattr(old, name) is getattr(streamvae, name)


def test_the_package_itself_imports_no_deprecated_path() -> None:
    for module in DEPRECATED:
        sys.modules.pop(module, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for module in ("streamvae", *DOCUMENTED):
            importlib.reload(importlib.import_module(module))
