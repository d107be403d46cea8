"""The streaming server: a Starlette app that sends each decode to the client as fragmented MP4 while it runs.

``GET /`` is a page with a ``<video>`` element and a form (frames, size, seed); ``GET /video.mp4?frames=
&size=&seed=`` decodes the embedded demo latent (or your own, see :func:`create_app`) and streams the MP4 as
each fragment is written; ``GET /stats`` reports the decodes in flight. Mount :func:`create_app`'s app in
your own ASGI server, or run ``streamvae serve`` (uvicorn, :func:`serve`).

Admission: at most ``max_concurrent`` decodes run at once and at most ``max_queued`` requests wait for one,
first come first served; a request beyond both is answered 503 with ``Retry-After`` at once, because a
client is better off retrying later than holding a connection in a queue it cannot see.

Every response ends its decode: a client that disconnects (while queued or streaming) cancels it, and so
does a reader that accepts no bytes for ``stall_timeout`` seconds — otherwise one stalled client would
hold a decode slot, and with it the accelerator, for as long as it likes. The decode then stops at its next
chunk and its session closes (no container, thread or slot outlives the request).
"""

from streamvae.server._admission import ServerStats
from streamvae.server._app import ServerEvent, VideoRequest, create_app
from streamvae.server._serve import serve

__all__ = ["ServerEvent", "ServerStats", "VideoRequest", "create_app", "serve"]
