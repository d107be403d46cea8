"""The examples run: a caller-owned producer loop pushing clips, the app mounted in another app, and latents
streamed as a stand-in model generates them.

The first two are imported and called here; the realtime one runs as its docstring says (``python
examples/realtime.py …``), its process forked from the suite's forkserver (tests/_forkserver.py) so that it
does not import torch and diffusers again."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests._forkserver import run_main
from tests._media import read_mp4
from tests._server import running_server

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_producer_loop_pushes_one_clip_per_iteration(tmp_path: Path) -> None:
    output = tmp_path / "clips.mp4"
    frames = await load_example("producer_loop").generate(output, iterations=2, size=32)
    assert frames == 26
    assert read_mp4(output.read_bytes()).frames.shape == (26, 32, 32, 3)


async def test_the_mounted_app_serves_its_page_video_and_the_host_routes() -> None:
    app = load_example("asgi_app").app
    with running_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            health = (await client.get("/health")).json()
            page = await client.get("/streamvae/")
            video = await client.get("/streamvae/video.mp4?frames=5&size=32")
    assert health == {"ok": True, "decoding": 0, "waiting": 0}
    assert page.status_code == 200 and "<video" in page.text
    assert video.status_code == 200 and read_mp4(video.content).frames.shape == (5, 32, 32, 3)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_realtime_example_writes_the_video_while_latents_arrive_step_by_step(
    tmp_path: Path, backend: str
) -> None:
    output = tmp_path / "realtime.mp4"
    command = [str(EXAMPLES / "realtime.py"), "-o", str(output), "--backend", backend]
    command += ["--frames", "9", "--size", "32", "--delay", "0.01"]
    result = run_main(command, cwd=Path.cwd(), env=dict(os.environ), timeout_s=300)
    assert result.status == 0, result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("step")] == [
        "step 1/3",
        "step 2/3",
        "step 3/3",
    ]
    assert "first bytes at" in result.stdout
    assert read_mp4(output.read_bytes()).frames.shape == (9, 32, 32, 3)
