"""The failure record: the first error is kept once and raised unwrapped; different errors make a group."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from streamvae._failure import FailureRecord


def failed_with(*errors: BaseException | None) -> FailureRecord:
    failure = FailureRecord()
    for error in errors:
        failure.record(error)
    return failure


def test_a_new_record_has_not_failed_and_raises_nothing() -> None:
    failure = FailureRecord()
    assert not failure.failed
    assert failure.first is None
    failure.raise_if_failed()  # raises nothing
    failure.raise_if_undelivered()  # raises nothing


def test_recording_none_keeps_nothing() -> None:
    failure = failed_with()
    failure.record(None)
    assert not failure.failed and failure.errors == []
    failure.raise_if_failed()  # raises nothing


def test_the_first_error_stays_first_and_later_ones_follow_in_order() -> None:
    first, second, third = ValueError("bad option"), OSError("disk full"), RuntimeError("encoder died")
    failure = failed_with(first, second, None, third)
    assert failure.failed
    assert failure.first is first
    assert failure.errors == [first, second, third]


def test_the_same_error_reaching_several_stages_is_kept_once() -> None:
    error = OSError("disk full")
    other = ValueError("bad option")
    failure = failed_with(error, error, other, error)
    assert failure.errors == [error, other]


def test_equal_but_separate_errors_are_each_kept() -> None:
    # Kept by identity: the record dedupes objects; only raising merges errors that read the same.
    first, second = ValueError("bad option"), ValueError("bad option")
    assert failed_with(first, second).errors == [first, second]


@pytest.mark.parametrize("raise_it", [FailureRecord.raise_if_failed, FailureRecord.raise_if_undelivered])
def test_a_single_failure_no_caller_has_seen_is_raised_itself_unwrapped(
    raise_it: Callable[[FailureRecord], None],
) -> None:
    error = OSError("disk full")
    with pytest.raises(OSError) as raised:
        raise_it(failed_with(error))
    assert raised.value is error


def test_identical_failures_of_several_entries_raise_the_first_one_unwrapped() -> None:
    # A bad codec option reaches every entry's encoder: the user catches the error they know, not a group.
    errors = [ValueError("unknown option 'crff'") for _ in range(3)]
    with pytest.raises(ValueError) as raised:
        failed_with(*errors).raise_if_failed()
    assert raised.value is errors[0]
    assert not isinstance(raised.value, BaseExceptionGroup)


@pytest.mark.parametrize(
    "errors",
    [
        pytest.param((ValueError("bad option"), OSError("disk full")), id="different types and messages"),
        pytest.param((ValueError("entry 0"), ValueError("entry 1")), id="one type, different messages"),
        pytest.param((ValueError("same words"), TypeError("same words")), id="one message, different types"),
    ],
)
def test_different_failures_raise_a_group_holding_them_in_order(errors: tuple[Exception, ...]) -> None:
    with pytest.raises(BaseExceptionGroup) as raised:
        failed_with(*errors).raise_if_failed()
    assert raised.value.exceptions == errors
    assert raised.value.message == "several stages of the streamvae session failed"


def test_a_group_of_ordinary_errors_is_an_exception_group_that_except_exception_catches() -> None:
    with pytest.raises(ExceptionGroup) as raised:
        failed_with(ValueError("a"), OSError("b")).raise_if_failed()
    assert isinstance(raised.value, Exception)


def test_a_group_with_an_interrupt_is_a_base_exception_group() -> None:
    interrupt, error = KeyboardInterrupt(), OSError("disk full")
    with pytest.raises(BaseExceptionGroup) as raised:
        failed_with(interrupt, error).raise_if_failed()
    assert not isinstance(raised.value, Exception)
    assert raised.value.exceptions == (interrupt, error)


def test_raise_if_undelivered_is_quiet_once_a_caller_has_seen_the_failure() -> None:
    error = OSError("disk full")
    failure = failed_with(error)
    with pytest.raises(OSError):
        failure.raise_if_failed()  # push or a stream delivered it
    failure.raise_if_undelivered()  # raises nothing


def test_raise_if_undelivered_delivers_the_failure_only_once() -> None:
    failure = failed_with(OSError("disk full"))
    with pytest.raises(OSError):
        failure.raise_if_undelivered()
    failure.raise_if_undelivered()  # raises nothing


def test_a_delivered_failure_is_still_raised_by_every_later_call() -> None:
    # push after a failure keeps failing: delivery only spares the end of the block a second raise.
    error = OSError("disk full")
    failure = failed_with(error)
    for _ in range(2):
        with pytest.raises(OSError) as raised:
            failure.raise_if_failed()
        assert raised.value is error


def test_an_error_recorded_after_delivery_joins_the_group_later_calls_raise() -> None:
    first, later = OSError("disk full"), RuntimeError("encoder died")
    failure = failed_with(first)
    with pytest.raises(OSError):
        failure.raise_if_failed()
    failure.record(later)
    with pytest.raises(BaseExceptionGroup) as raised:
        failure.raise_if_failed()
    assert raised.value.exceptions == (first, later)
