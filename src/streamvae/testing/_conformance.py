"""The conformance suite for chunked decoders: :func:`check_chunked_decoder` and what it reports.

It tests the contract of :class:`streamvae.SupportsChunkedVAEDecode` once, for any decoder — streamvae's
adapters and yours alike — the way ``trio.testing.check_one_way_stream`` tests a stream: call it from your
test suite with a small latent and the decode it must reproduce. It needs no test framework: a broken
contract is an AssertionError that names the decoder and what it broke.
"""

# No ``from __future__ import annotations`` here: ChunkedDecoderReport shows as streamvae.testing's, and
# typing.get_type_hints resolves string annotations in that module, which does not import Tensor.

import contextlib
import gc
import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from streamvae.models import ChunkedDecoder, as_decoder
from streamvae.models._common import execution_device

__all__ = ["ChunkedDecoderReport", "check_chunked_decoder"]


@dataclass(frozen=True)
class ChunkedDecoderReport:
    """What :func:`check_chunked_decoder` saw in the decode that ran to its end."""

    #: the published chunks, copies taken as each was published
    chunks: list[Tensor]
    #: decoder-module calls made by the time each chunk was published; None without a module to count
    decoder_calls: list[int] | None

    @property
    def chunk_frames(self) -> list[int]:
        """Frames per chunk."""
        return [chunk.shape[2] for chunk in self.chunks]


class _OnChunkError(Exception):
    """What the suite's failing ``on_chunk`` raises (an ordinary error: a closed sink)."""


class _OnChunkInterrupt(BaseException):
    """What the suite's failing ``on_chunk`` raises standing for trio's ``Cancelled`` or KeyboardInterrupt."""


def check_chunked_decoder(
    decoder: Any,
    z: Tensor,
    *,
    reference: Tensor | Callable[[Tensor], Tensor],
    atol: float = 0.0,
    rtol: float = 0.0,
    step_module: nn.Module | None = None,
) -> ChunkedDecoderReport:
    """Check that ``decoder`` keeps the chunked-decode contract on latent ``z``; raise AssertionError if not.

    ``decoder`` is anything :func:`streamvae.models.as_decoder` takes: a
    :class:`~streamvae.models.ChunkedDecoder`, a decoder implementing only the protocol, or a supported
    diffusers VAE. ``z`` is a latent it decodes
    (already prepared: on its device, in its dtype), with at least two chunks to check a failure after the
    first. ``reference`` is the decode the chunks must reproduce: a tensor, or a callable given ``z`` (run
    under ``torch.no_grad``), e.g. ``lambda z: vae.decode(z).sample``. Exact (``torch.equal``) unless
    ``atol`` or ``rtol`` is given (``torch.allclose``).

    Checked:

    - malformed latents (not a tensor, not 5-D, the wrong channel count when ``latent_channels`` is known,
      empty) raise TypeError / ValueError naming ``z`` from ``check_latents``, ``prepare_latents`` and
      ``decode_with_chunks``, with nothing decoded or published;
    - ``prepare_latents`` keeps the shape and, for a decoder over a VAE, casts to its dtype and execution
      device;
    - an ``on_chunk`` raising at the first and at the second chunk (an Exception, then a BaseException):
      it is not called again, the very error is re-raised, no decoder step runs after it (a decoder that
      ``drain``\\ s runs every step), and every published chunk is freed while the error is still alive;
    - a decode after those failures: each chunk is 5-D with the batch of ``z``, carries no autograd graph,
      never changes once published, and the chunks concatenated along T equal ``reference``;
    - the VAE's accelerate hook (``vae._hf_hook.pre_forward``) runs once per decode;
    - a decoder that ``takes_pieces`` gives the same frames fed one latent frame at a time.

    Not checkable without a module: decoder steps are counted by calls of ``step_module`` (default
    ``decoder.vae.decoder`` when it is a module); without one, stopping is checked only through
    ``on_chunk``. The hook is checked only when the VAE has one: attach any accelerate hook
    (``accelerate.hooks.add_hook_to_module(vae, ModelHook())``) to check it. A distributed decoder's peers
    are not exercised. Returns what the complete decode published (:class:`ChunkedDecoderReport`).
    """
    decoder = as_decoder(decoder)
    name = type(decoder).__qualname__
    if isinstance(reference, Tensor):
        expected = reference
    else:
        with torch.no_grad():
            expected = reference(z)
    module = step_module if step_module is not None else _decoder_module(decoder)
    with _counting_calls(module) as steps, _counting_pre_forward(decoder.vae) as hooks:
        suite = _Suite(decoder, name, steps, hooks)
        suite.check_latent_errors(z)
        suite.check_prepare(z)
        failed_steps = [
            suite.fail_at(z, 0, _OnChunkError("on_chunk failed at chunk 0")),
            suite.fail_at(z, 1, _OnChunkInterrupt("on_chunk interrupted at chunk 1")),
        ]
        report = suite.decode(z)
        suite.expect_equal(report.chunks, expected, atol, rtol, "after the failed decodes")
        if decoder.drain and report.decoder_calls:
            total = report.decoder_calls[-1]
            suite.expect(
                all(calls in (None, total) for calls in failed_steps),
                f"drains, so a failed decode runs all {total} decoder steps, but ran {failed_steps}",
            )
        if decoder.takes_pieces:
            suite.expect_equal(
                suite.decode_in_pieces(z), expected, atol, rtol, "fed one latent frame a piece"
            )
    return report


class _Suite:
    def __init__(
        self, decoder: ChunkedDecoder, name: str, steps: list[int] | None, hooks: list[int] | None
    ) -> None:
        self.decoder = decoder
        self.name = name
        self.steps = steps
        self.hooks = hooks

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            raise AssertionError(f"check_chunked_decoder: {self.name} {message}")

    def step_count(self) -> int:
        return 0 if self.steps is None else self.steps[0]

    @contextlib.contextmanager
    def one_hook_call(self, what: str) -> Iterator[None]:
        before = None if self.hooks is None else self.hooks[0]
        yield
        if self.hooks is not None and before is not None:
            calls = self.hooks[0] - before
            self.expect(calls == 1, f"ran the VAE's forward hook {calls} times in {what}, not once")

    def check_latent_errors(self, z: Tensor) -> None:
        cases: list[tuple[str, Any, type[Exception]]] = [
            ("a numpy array", np.zeros(tuple(z.shape), dtype=np.float32), TypeError),
            ("a 4-D latent", z[0], ValueError),
            ("a 6-D latent", z.unsqueeze(0), ValueError),
            ("a latent without frames", z[:, :, :0], ValueError),
            ("a latent without entries", z[:0], ValueError),
            ("a latent of zero height", z[:, :, :, :0], ValueError),
        ]
        if self.decoder.latent_channels is not None:
            cases.append(("a latent with one channel too many", torch.cat([z, z[:, :1]], dim=1), ValueError))
        published: list[Tensor] = []
        before = self.step_count()
        for what, bad, error_type in cases:
            calls: list[tuple[str, Callable[[], object]]] = [
                ("check_latents", partial(self.decoder.check_latents, bad)),
                ("prepare_latents", partial(self.decoder.prepare_latents, bad)),
                (
                    "decode_with_chunks",
                    partial(self.decoder.decode_with_chunks, bad, on_chunk=published.append),
                ),
            ]
            for method, call in calls:
                try:
                    call()
                except error_type as error:
                    self.expect(
                        re.search(r"\bz\b", str(error)) is not None,
                        f".{method} raised for {what} without naming the latent z: {error}",
                    )
                except Exception as error:
                    raise AssertionError(
                        f"check_chunked_decoder: {self.name}.{method} raised {type(error).__name__} for "
                        f"{what}, not {error_type.__name__}: {error}"
                    ) from error
                else:
                    self.expect(False, f".{method} accepted {what}")
        self.expect(not published, "published chunks of a malformed latent")
        self.expect(self.step_count() == before, "ran decoder steps on a malformed latent")

    def check_prepare(self, z: Tensor) -> None:
        prepared = self.decoder.prepare_latents(z.to(torch.float64))
        self.expect(
            isinstance(prepared, Tensor) and prepared.shape == z.shape,
            f".prepare_latents changed the latent's shape {tuple(z.shape)}",
        )
        vae = self.decoder.vae
        dtype: Any = getattr(vae, "dtype", None)
        if isinstance(vae, nn.Module) and isinstance(dtype, torch.dtype):
            where = (prepared.dtype, prepared.device)
            wanted = (dtype, execution_device(vae))
            self.expect(where == wanted, f".prepare_latents gave {where}, not the VAE's {wanted}")

    def fail_at(self, z: Tensor, index: int, error: BaseException) -> int | None:
        """Decode with an ``on_chunk`` raising ``error`` at chunk ``index``; the decoder steps it ran."""
        published: list[weakref.ref[Tensor]] = []
        steps_at_failure = [0]

        def on_chunk(chunk: Tensor) -> None:
            published.append(weakref.ref(chunk))
            if len(published) == index + 1:
                steps_at_failure[0] = self.step_count()
                raise error

        before = self.step_count()
        what = f"a decode whose on_chunk raised {type(error).__name__} at chunk {index}"
        with self.one_hook_call(what):
            try:
                self.decoder.decode_with_chunks(z, on_chunk=on_chunk)
            except BaseException as raised:
                if raised is not error and not isinstance(raised, Exception):
                    raise  # not the suite's: a real interrupt
                self.expect(raised is error, f"raised {raised!r} in {what}, not that error")
            else:
                if len(published) <= index:
                    return None  # fewer chunks than that: nothing to fail
                self.expect(False, f"returned normally from {what}")
        self.expect(len(published) == index + 1, f"called on_chunk {len(published)} times in {what}")
        steps = self.step_count() - before
        if not self.decoder.drain:
            self.expect(
                steps == steps_at_failure[0] - before,
                f"ran {steps} decoder steps in {what}, {steps_at_failure[0] - before} before the failure",
            )
        alive = [i for i, ref in enumerate(published) if ref() is not None]
        if alive:  # refcounting frees what nothing holds; a full collection only for cycles (it is slow)
            gc.collect()
            alive = [i for i, ref in enumerate(published) if ref() is not None]
        self.expect(
            not alive,
            f"kept chunks {alive} alive after {what} (its traceback holds them? "
            "streamvae.publish_chunks clears the frames it owns)",
        )
        error.__traceback__ = None
        return steps

    def decode(self, z: Tensor) -> ChunkedDecoderReport:
        published: list[tuple[Tensor, Tensor]] = []
        calls: list[int] = []
        before = self.step_count()

        def on_chunk(chunk: Tensor) -> None:
            calls.append(self.step_count() - before)
            published.append((chunk, chunk.clone()))

        with self.one_hook_call("a decode"):
            self.decoder.decode_with_chunks(z, on_chunk=on_chunk)
        self.expect(bool(published), "published no chunk")
        for k, (chunk, at_publish) in enumerate(published):
            self.expect(
                chunk.ndim == 5 and chunk.shape[0] == z.shape[0] and chunk.shape[2] > 0,
                f"published chunk {k} of shape {tuple(chunk.shape)}: not [{z.shape[0]}, C, T>0, H, W]",
            )
            self.expect(not chunk.requires_grad, f"published chunk {k} with an autograd graph")
            self.expect(torch.equal(chunk, at_publish), f"changed chunk {k} after publishing it")
        return ChunkedDecoderReport(
            chunks=[at_publish for _, at_publish in published],
            decoder_calls=None if self.steps is None else calls,
        )

    def decode_in_pieces(self, z: Tensor) -> list[Tensor]:
        decoder = self.decoder
        state = decoder.start(z.shape[0], z.shape[3], z.shape[4])
        chunks: list[Tensor] = []
        for k in range(z.shape[2]):
            with self.one_hook_call(f"feeding latent frame {k}"):
                chunks.extend(chunk.clone() for chunk in decoder.feed(state, z[:, :, k : k + 1]))
        chunks.extend(chunk.clone() for chunk in decoder.end(state))
        return chunks

    def expect_equal(
        self, chunks: list[Tensor], expected: Tensor, atol: float, rtol: float, when: str
    ) -> None:
        expected = expected.to(chunks[0].device)
        shapes = {(chunk.shape[:2], chunk.shape[3:]) for chunk in chunks}
        self.expect(len(shapes) == 1, f"published chunks of different shapes {sorted(map(str, shapes))}")
        video = torch.cat(chunks, dim=2)
        self.expect(
            video.shape == expected.shape,
            f"published {tuple(video.shape)} ({when}), the reference is {tuple(expected.shape)}",
        )
        if atol == 0.0 and rtol == 0.0:
            same = video.dtype == expected.dtype and torch.equal(video, expected)
        else:
            same = torch.allclose(video.double(), expected.double(), atol=atol, rtol=rtol)
        if not same:
            difference = (video.double() - expected.double()).abs()
            frames = difference.amax(dim=(0, 1, 3, 4)).nonzero().flatten().tolist()
            self.expect(
                False,
                f"decoded ({when}) frames that differ from the reference: frames {frames[:8]} "
                f"(max |difference| {float(difference.max()):.3g}, dtypes {video.dtype} / {expected.dtype})",
            )


def _decoder_module(decoder: ChunkedDecoder) -> nn.Module | None:
    module = getattr(decoder.vae, "decoder", None)
    return module if isinstance(module, nn.Module) else None


@contextlib.contextmanager
def _counting_calls(module: nn.Module | None) -> Iterator[list[int] | None]:
    """Count forward calls of ``module`` (one per decoder step and tile) while the block runs."""
    if module is None:
        yield None
        return
    calls = [0]

    def count(module: nn.Module, args: tuple[Any, ...]) -> None:
        calls[0] += 1

    handle = module.register_forward_pre_hook(count)
    try:
        yield calls
    finally:
        handle.remove()


@contextlib.contextmanager
def _counting_pre_forward(vae: Any) -> Iterator[list[int] | None]:
    """Count calls of ``vae._hf_hook.pre_forward`` (accelerate's hook) while the block runs."""
    hook = getattr(vae, "_hf_hook", None)
    if hook is None or not hasattr(hook, "pre_forward"):
        yield None
        return
    calls = [0]
    own = hook.__dict__.get("pre_forward")
    original = hook.pre_forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    hook.pre_forward = counting
    try:
        yield calls
    finally:
        if own is None:
            del hook.pre_forward
        else:
            hook.pre_forward = own
