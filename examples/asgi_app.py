"""Mount streamvae's streaming app inside your own ASGI application.

``create_app()`` is an ordinary Starlette app: mount it under a prefix next to your own routes and serve
the whole thing with any ASGI server. Its page links to ``video.mp4`` relatively, so it works mounted.

    uvicorn examples.asgi_app:app --port 8000        # then open http://127.0.0.1:8000/streamvae/

To stream your own model instead of the demo, pass the diffusers VAE you already have and a function that
builds the latent of a request (it runs in a worker thread)::

    create_app(vae=pipe.vae, latents=lambda request: generate_latents(request.seed, request.frames))
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from streamvae.server import create_app

# Four decodes at once, eight more may wait; a reader idle for 20 s is cut off and its decode cancelled.
streaming = create_app(max_concurrent=4, max_queued=8, stall_timeout=20.0)


async def health(request: Request) -> Response:
    stats = streaming.state.stats
    return JSONResponse({"ok": True, "decoding": stats.active, "waiting": stats.queued})


app = Starlette(routes=[Route("/health", health), Mount("/streamvae", app=streaming)])
