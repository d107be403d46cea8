"""MediaTimePacer: fragments leave on media time, on a fake clock (nothing here really sleeps)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamvae.server._pacing import MediaTimePacer


class FakeClock:
    """A clock that moves only when told to; its ``sleep`` moves it by the time asked for."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def pacer(clock: FakeClock, fps: float = 10, **kwargs: float) -> MediaTimePacer:
    return MediaTimePacer(fps, clock=clock, sleep=clock.sleep, **kwargs)


def test_the_first_fragment_is_never_held() -> None:
    clock = FakeClock()
    assert pacer(clock).delay_for(40) == 0.0


def test_a_later_fragment_waits_for_its_media_time() -> None:
    clock = FakeClock()
    schedule = pacer(clock)  # 10 fps: a frame is 0.1 s
    schedule.delay_for(5)  # sent at 100.0; plays 100.0 … 100.5
    clock.now = 100.1
    assert schedule.delay_for(4) == pytest.approx(0.4)  # its first frame plays at 100.5
    clock.now = 100.5  # it left after its wait
    assert schedule.delay_for(4) == pytest.approx(0.4)  # 9 frames in: 100.9


def test_lead_lets_a_fragment_leave_that_much_before_its_media_time() -> None:
    clock = FakeClock()
    schedule = pacer(clock, lead=0.3)
    schedule.delay_for(10)
    assert schedule.delay_for(10) == pytest.approx(0.7)  # due at 101.0 − 0.3


def test_a_late_fragment_goes_at_once_and_the_schedule_keeps_its_origin_within_max_lag() -> None:
    clock = FakeClock()
    schedule = pacer(clock, max_lag=5.0)
    schedule.delay_for(10)  # origin 100.0
    clock.now = 104.0  # due at 101.0: 3 s late, within max_lag
    assert schedule.delay_for(10) == 0.0
    # The origin stands: the next one (20 frames in, due at 102.0) is late too, and is caught up at once.
    assert schedule.delay_for(30) == 0.0
    clock.now = 104.5
    assert schedule.delay_for(1) == pytest.approx(0.5)  # 50 frames in: due at 105.0
    assert schedule.statistics().rebases == 0


def test_falling_behind_by_more_than_max_lag_makes_the_late_fragment_the_new_origin() -> None:
    clock = FakeClock()
    schedule = pacer(clock, max_lag=5.0)
    schedule.delay_for(10)  # origin 100.0, next due at 101.0
    clock.now = 110.0  # 9 s late
    assert schedule.delay_for(10) == 0.0
    # No burst: the fragment after it waits for its media time after the new origin (110.0 + 1.0).
    assert schedule.delay_for(10) == pytest.approx(1.0)
    statistics = schedule.statistics()
    assert statistics.rebases == 1 and statistics.fragments == 3 and statistics.frames == 30
    assert statistics.held == 1 and statistics.seconds_held == pytest.approx(1.0)


def test_an_infinite_max_lag_never_rebases() -> None:
    clock = FakeClock()
    schedule = pacer(clock, max_lag=math.inf)
    schedule.delay_for(10)
    clock.now = 1000.0
    assert schedule.delay_for(10) == 0.0
    assert schedule.delay_for(10) == 0.0  # still owed against the first origin
    assert schedule.statistics().rebases == 0


@pytest.mark.anyio
async def test_wait_sleeps_only_for_an_early_fragment() -> None:
    clock = FakeClock()
    schedule = pacer(clock, fps=16)
    await schedule.wait(1)
    await schedule.wait(4)  # due 1/16 s after the first
    clock.now += 10  # the generation fell behind
    await schedule.wait(4)
    assert clock.sleeps == [pytest.approx(1 / 16)]


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"fps": 0}, "MediaTimePacer: fps must be a number between"),
        ({"fps": "16"}, "MediaTimePacer: fps must be a number"),
        ({"lead": -0.1}, "MediaTimePacer: lead must be a finite number of seconds >= 0"),
        ({"lead": math.inf}, "MediaTimePacer: lead must be"),
        ({"lead": True}, "MediaTimePacer: lead must be"),
        ({"max_lag": -1}, "MediaTimePacer: max_lag must be a number of seconds >= 0"),
        ({"max_lag": math.nan}, "MediaTimePacer: max_lag must be"),
    ],
)
def test_bad_values_are_value_errors_naming_the_pacer(keywords: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"fps": 16, **keywords}
    with pytest.raises(ValueError, match=message):
        MediaTimePacer(**arguments)  # type: ignore[arg-type]


def test_a_clock_that_is_not_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="MediaTimePacer: clock must be a callable"):
        MediaTimePacer(16, clock=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MediaTimePacer: sleep must be a callable"):
        MediaTimePacer(16, sleep=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("frames", [-1, 1.5, True, "4"])
def test_a_bad_frame_count_is_a_value_error(frames: object) -> None:
    with pytest.raises(ValueError, match="MediaTimePacer.delay_for: frames must be an int"):
        MediaTimePacer(16).delay_for(frames)  # type: ignore[arg-type]


fragments = st.lists(
    st.tuples(st.integers(0, 12), st.floats(0, 3, allow_nan=False)),  # (frames, seconds to generate it)
    min_size=1,
    max_size=40,
)


@given(
    fragments,
    st.sampled_from([8, 16, 24, 30]),
    st.sampled_from([0.0, 0.2, 1.0]),
    st.sampled_from([0.5, 2.0, 5.0]),
)
def test_every_schedule_follows_the_rules(
    schedule: list[tuple[int, float]], fps: int, lead: float, max_lag: float
) -> None:
    """Each fragment is made ``seconds`` after the previous one left, then goes when the pacer says: never
    before its media time − lead since the origin, at once when late, and the origin moves to a fragment
    late by more than max_lag (the first fragment is the first origin)."""
    clock = FakeClock(0.0)
    pacer = MediaTimePacer(fps, lead=lead, max_lag=max_lag, clock=clock)
    origin_sent = origin_frames = 0.0  # when the origin left, and the frames sent before it
    frames_sent = 0
    for index, (frames, seconds) in enumerate(schedule):
        clock.now += seconds
        made = clock.now
        clock.now += pacer.delay_for(frames)
        if index == 0:
            assert clock.now == made  # never held
            origin_sent, origin_frames = made, 0
        else:
            due = origin_sent + (frames_sent - origin_frames) / fps - lead
            assert clock.now >= due - 1e-9  # never early
            assert clock.now == pytest.approx(max(made, due), abs=1e-9)  # no later than needed
            if made - due > max_lag:  # fell behind too far: this one is the origin now
                origin_sent, origin_frames = made, frames_sent
        frames_sent += frames
    assert pacer.statistics().frames == frames_sent
