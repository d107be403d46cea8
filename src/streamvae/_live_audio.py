"""Live audio: an entry's sound pushed as it is made, taken by the entry's encoder as the video goes.

A real-time generator makes its sound piece by piece, as it makes its video. With
``SessionOptions.audio_channels`` every entry has a live track. :class:`LiveAudio` is the session's side:
it checks each push (from any thread, at once), keeps the pushes made before the first chunk (no encoder
exists yet), learns the batch from the first chunk, and is closed at ``finish`` or abort, after which
nothing more is taken. :class:`LiveAudioTrack` is one entry's buffer: pushes append to it, and the entry's
encoder takes the samples up to the video's time as far as they have arrived; what it took is no longer
held, so a long session's memory stays flat. A whole waveform (``audio_waveforms``) is a track that is
already complete (:meth:`LiveAudioTrack.whole`), so the encoder has one way to take its sound.

At ``finish`` each track must last as long as the video: within one video frame's samples it is padded
with silence or trimmed (a generator's sound rarely ends on a frame boundary); further off is an error
that says both durations, because nothing is dropped, or made up, without a word.
"""

from __future__ import annotations

import threading
from collections import deque
from fractions import Fraction
from typing import Any

import numpy as np

from streamvae._checks import check_int, check_waveform
from streamvae._errors import SessionClosedError

__all__ = ["LiveAudio", "LiveAudioTrack", "samples_for_frames"]

Samples = np.ndarray[Any, np.dtype[np.float32]]


def samples_for_frames(frames: int, fps: Fraction, sample_rate: int) -> int:
    """The audio samples that last as long as ``frames`` video frames (rounded down)."""
    return int(Fraction(frames) / fps * sample_rate)


class LiveAudioTrack:
    """One entry's pushed samples, float32 ``[channels, samples]``, until its encoder takes them.

    Once :meth:`end` says no more will come, the track is complete: every sample taken past what was
    pushed is silence. Thread-safe: pushes come from any thread, the encoder takes from its worker thread.
    """

    def __init__(self, channels: int) -> None:
        self.channels = channels
        #: samples pushed so far, taken or not
        self.pushed = 0
        #: samples pushed and not yet taken: all that the track holds in memory
        self.buffered = 0
        self._lock = threading.Lock()
        self._pieces: deque[Samples] = deque()
        self._ended = False

    @classmethod
    def whole(cls, waveform: Samples) -> LiveAudioTrack:
        """A track that is already complete: ``waveform`` (``[channels, samples]``), then silence."""
        track = cls(waveform.shape[0])
        track.append(np.asarray(waveform, dtype=np.float32))
        track.end()
        return track

    def append(self, samples: Samples) -> None:
        """Add ``samples`` (``[channels, n]``, owned by the track from now on) after those pushed before."""
        if not samples.shape[1]:
            return
        with self._lock:
            self._pieces.append(samples)
            self.buffered += samples.shape[1]
            self.pushed += samples.shape[1]

    def end(self) -> None:
        """No more samples will come: from now on :meth:`take` gives silence for those that never came."""
        with self._lock:
            self._ended = True

    def take(self, most: int) -> Samples:
        """The next samples, up to ``most`` of them as far as they have arrived (maybe none; once the track
        ended, always ``most``, silence past what was pushed), contiguous."""
        taken: list[Samples] = []
        with self._lock:
            wanted = min(most, self.buffered)
            silence = most - wanted if self._ended else 0
            self.buffered -= wanted
            while wanted:
                piece = self._pieces[0]
                if piece.shape[1] <= wanted:
                    taken.append(self._pieces.popleft())
                    wanted -= piece.shape[1]
                else:
                    taken.append(piece[:, :wanted])
                    self._pieces[0] = piece[:, wanted:]
                    wanted = 0
        if silence:
            taken.append(np.zeros((self.channels, silence), np.float32))
        if not taken:
            return np.zeros((self.channels, 0), np.float32)
        return np.ascontiguousarray(np.concatenate(taken, axis=1) if len(taken) > 1 else taken[0])


class LiveAudio:
    """The live tracks of one session: ``channels`` channels at ``sample_rate`` Hz, one per entry.

    Thread-safe. Pushes before the first chunk are kept per entry; :meth:`start` hands the encoders one
    track per entry of the batch; :meth:`close` refuses every later push.
    """

    def __init__(self, channels: int, sample_rate: int) -> None:
        self.channels = channels
        self.sample_rate = sample_rate
        self._lock = threading.Lock()
        self._tracks: dict[int, LiveAudioTrack] = {}
        self._batch: int | None = None
        self._closed: str | None = None  # the state of the session that closed it

    def push(self, waveform: object, *, entry: object, owner: str) -> None:
        """Append ``waveform`` to entry ``entry``'s track (checked here: ValueError for a bad value,
        SessionClosedError once closed). The samples are copied: the caller may reuse its buffer."""
        index = check_int("entry", entry, minimum=0, owner=owner)
        samples = check_waveform(waveform, name=f"{owner}: waveform")
        if samples.shape[0] != self.channels:
            raise ValueError(
                f"{owner}: waveform has {samples.shape[0]} channel{'s' * (samples.shape[0] != 1)} but the "
                f"session's live audio has audio_channels={self.channels}: push [{self.channels}, samples]"
                + (" (or [samples])" if self.channels == 1 else "")
            )
        owned = np.array(samples, dtype=np.float32, copy=True)  # the check may have returned the caller's
        with self._lock:
            if self._closed is not None:
                raise SessionClosedError(f"{owner}() on a session that is {self._closed}")
            if self._batch is not None and index >= self._batch:
                raise ValueError(f"{owner}: entry {index} is not in the batch of {self._batch} entries")
            track = self._tracks.get(index)
            if track is None:
                track = self._tracks[index] = LiveAudioTrack(self.channels)
            track.append(owned)

    def check_batch(self, batch: int, *, owner: str | None = None) -> None:
        """Raise ValueError if audio was pushed for an entry outside a batch of ``batch`` entries."""
        with self._lock:
            self._check_batch(batch, owner)

    def start(self, batch: int) -> list[LiveAudioTrack]:
        """The track of every entry of the batch (what was pushed so far in it), for its encoder; later
        pushes are checked against ``batch``."""
        with self._lock:
            self._check_batch(batch, None)
            self._batch = batch
            return [self._tracks.setdefault(entry, LiveAudioTrack(self.channels)) for entry in range(batch)]

    def close(self, state: str) -> None:
        """Refuse every later push, naming the session's ``state`` (updated as the session moves on)."""
        with self._lock:
            self._closed = state

    def check_durations(self, frames: int, fps: Fraction, *, owner: str) -> None:
        """Raise ValueError unless every entry's track lasts as long as ``frames`` video frames, within one
        frame's samples (what the encoder then pads or trims). Call it once :meth:`start` gave every entry
        its track and :meth:`close` refused further pushes."""
        rate = self.sample_rate
        video = samples_for_frames(frames, fps, rate)
        one_frame = Fraction(rate) / fps
        with self._lock:
            pushed = {entry: track.pushed for entry, track in sorted(self._tracks.items())}
        off = [entry for entry, count in pushed.items() if abs(count - video) > one_frame]
        if not off:
            return
        tracks = ", ".join(
            f"entry {entry}'s {pushed[entry] / rate:.3f} s ({pushed[entry]} samples)" for entry in off
        )
        raise ValueError(
            f"{owner}: the live audio does not last as long as the video: {tracks} at {rate} Hz, but the "
            f"video lasts {float(frames / fps):.3f} s ({frames} frames at {fps} fps); push_audio must give "
            f"the video's duration within one frame ({float(one_frame):g} samples), which is padded with "
            "silence or trimmed"
        )

    def _check_batch(self, batch: int, owner: str | None) -> None:
        outside = [entry for entry in self._tracks if entry >= batch]
        if outside:
            where = "" if owner is None else f"{owner}: "
            raise ValueError(
                f"{where}push_audio() was given entry {max(outside)}, but the batch size is {batch}"
            )
