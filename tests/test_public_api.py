"""The public surface: what users import is importable and shows where they import it from; the
implementation modules are private by name, and no module reaches into another's private names."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

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
    "streamvae.server": [
        "MP4Response",
        "MediaTimePacer",
        "ReaderStalledError",
        "create_app",
        "realtime_video_endpoint",
        "serve",
    ],
    "streamvae.cli": ["main", "load_latents", "load_vae", "run_decode"],
    "streamvae.demo": ["DEMO_FPS", "demo_latent", "demo_vae"],
    "streamvae.pipelines": ["generate_mp4", "stream_generation"],
    "streamvae.testing": [
        "TINY_VAE_CONFIGS",
        "check_chunked_decoder",
        "enable_small_tiling",
        "foreign_threads",
        "open_containers",
    ],
}
SOURCE = pathlib.Path(streamvae.__file__).parent


def test_every_exported_name_is_importable_and_no_helper_is_exported() -> None:
    for name in streamvae.__all__:
        assert getattr(streamvae, name) is not None
    for helper in ("EntryEncoder", "merge_codec_options", "host_lease", "check_chunk", "check_int"):
        assert helper not in streamvae.__all__


def test_public_objects_show_as_streamvae_names_wherever_they_are_imported_from() -> None:
    for name in streamvae.__all__:
        home = importlib.import_module(f"streamvae.{streamvae._HOMES[name]}")
        assert getattr(home, name) is getattr(streamvae, name), name  # the map names the real home
        assert getattr(home, name).__module__ == "streamvae", name  # marked @public where it is defined
    assert repr(streamvae.ChunkedVideoMP4Session) == "<class 'streamvae.ChunkedVideoMP4Session'>"
    assert sorted(streamvae._HOMES) == sorted(streamvae.__all__)


def test_importing_streamvae_imports_neither_torch_nor_pyav() -> None:
    # The names load on first use: a CLI's --help (and anything that only needs a name) answers at once.
    code = "import sys, streamvae; print(sorted({'torch', 'av', 'diffusers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    code = "import sys; from streamvae import SessionOptions; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True"  # a name in use loads what it needs


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_the_documented_subpackages_export_their_names(module: str) -> None:
    imported = importlib.import_module(module)
    for name in DOCUMENTED[module]:
        assert name in imported.__all__ and getattr(imported, name) is not None


@pytest.mark.parametrize("old", ["session", "decode", "encode", "quantize", "transfer", "protocol"])
def test_the_pre_release_alias_modules_are_gone(old: str) -> None:
    # 0.1.0 was never released: nobody imports the old paths, so nothing keeps them.
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"streamvae.{old}")
    assert not hasattr(streamvae, "ArgumentTypeError")


def _private_imports() -> list[str]:
    """``module: name`` for every private name a streamvae module imports from another module."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("streamvae"):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.append(f"{path.relative_to(SOURCE)}: {alias.name} from {node.module}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    # Private modules (``streamvae._session``) are the implementation and import each other's public
    # names; a private *name* (``_chunk_bridge``) is its module's own: a seam two modules need gets a name.
    assert _private_imports() == []


@pytest.mark.parametrize("module", ["streamvae", "streamvae.models", "streamvae.pipelines"])
def test_importing_the_package_does_not_import_diffusers(module: str) -> None:
    # diffusers takes seconds to import: only a diffusers VAE or pipeline in hand pulls it in.
    code = f"import sys, {module}; print('diffusers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
