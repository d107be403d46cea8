"""The streaming server: a Starlette app that sends each decode to the client as fragmented MP4 while it runs.

``GET /`` is a page with a ``<video>`` element and a form (frames, size, seed); ``GET /video.mp4?frames=
&size=&seed=`` decodes the embedded demo latent (or your own, see :func:`create_app`) and streams the MP4 as
each fragment is written; ``GET /stats`` reports the decodes in flight; ``WS /v1/realtime/video`` speaks
vllm-omni's real-time protocol (:func:`realtime_video_endpoint`): the client steers the generation with
``session.interaction`` messages, which a :data:`RealtimeGenerator` hears through its :class:`Interactions`
while it yields pieces (:class:`RealtimePiece`: a latent, its sound, the events it reflects). Mount
:func:`create_app`'s app in your own ASGI server, or run ``streamvae serve`` (uvicorn, :func:`serve`).

Everyone watches: each generation gets an id, and its MP4 pieces go to one :class:`Broadcast` that any
number of viewers read without slowing it (a viewer too slow for its bounded buffer is cut off,
:class:`ViewerCutOffError`). Under ``/v1/videos/{id}`` the app serves it as Low-Latency HLS with blocking
reload (``live.m3u8``: Safari, iPhone, hls.js), as the whole fragmented MP4 (``video.mp4``: live, then the
recording) and to WebSocket spectators (``watch``); ``GET /v1/videos`` lists them. Ended generations are
kept for replay, bounded by count and bytes, and written for a static origin with ``recording_dir``.

Your own routes: return :class:`MP4Response` (``return MP4Response(stream_mp4(vae, z, fps=16))``), which
owns the decode's lifetime (``broadcast=`` publishes what it sends), and mount
:func:`realtime_video_endpoint` with your generator; :class:`MediaTimePacer` paces fragments to their media
time.

Admission: at most ``max_concurrent`` decodes run at once and at most ``max_queued`` requests wait for one,
first come first served; a request beyond both is answered 503 with ``Retry-After`` at once, because a
client is better off retrying later than holding a connection in a queue it cannot see.

Every response ends its decode: a client that disconnects (while queued or streaming) cancels it, and so
does a reader that accepts no bytes for ``stall_timeout`` seconds — otherwise one stalled client would
hold a decode slot, and with it the accelerator, for as long as it likes. The decode then stops at its next
chunk and its session closes (no container, thread or slot outlives the request).
"""

from streamvae._errors import ReaderStalledError, ViewerCutOffError
from streamvae.server._admission import ServerStats
from streamvae.server._app import create_app
from streamvae.server._broadcast import Broadcast, BroadcastState, BroadcastStatistics, Part
from streamvae.server._pacing import MediaTimePacer, PacerStatistics
from streamvae.server._realtime import Interaction, Interactions, RealtimeGenerator, RealtimePiece
from streamvae.server._response import MP4Response
from streamvae.server._serve import serve
from streamvae.server._sessions import ServerEvent, VideoRequest
from streamvae.server._standin import demo_generator
from streamvae.server._websocket import realtime_video_endpoint

__all__ = [
    "Broadcast",
    "BroadcastState",
    "BroadcastStatistics",
    "Interaction",
    "Interactions",
    "MP4Response",
    "MediaTimePacer",
    "PacerStatistics",
    "Part",
    "ReaderStalledError",
    "RealtimeGenerator",
    "RealtimePiece",
    "ServerEvent",
    "ServerStats",
    "VideoRequest",
    "ViewerCutOffError",
    "create_app",
    "demo_generator",
    "realtime_video_endpoint",
    "serve",
]
