"""The failure record: a session's first error, kept once and raised where its callers wait.

Every stage of a session, its producer and its byte streams report errors to one record. The first error
is what ``push``, ``finish``, the streams and leaving the ``async with`` raise — unwrapped, because users
catch the error they know (a PyAV error, an ``OSError``), not a group. Several failures that are the same
(a bad codec option reaches every entry's encoder) are one; only genuinely different ones make a group.
"""

from __future__ import annotations

__all__ = ["FailureRecord"]


class FailureRecord:
    """The errors of one session, in the order they happened."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self._delivered = False

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    @property
    def first(self) -> BaseException | None:
        return self.errors[0] if self.errors else None

    def record(self, error: BaseException | None) -> None:
        """Keep ``error`` unless it is already kept (the same object reaches several stages)."""
        if error is not None and not any(error is seen for seen in self.errors):
            self.errors.append(error)

    def raise_if_failed(self) -> None:
        """Raise the failure (see the module docstring) if there is one."""
        if not self.errors:
            return
        self._delivered = True
        distinct = {(type(e), str(e)) for e in self.errors}
        if len(distinct) == 1:
            raise self.errors[0]
        raise BaseExceptionGroup("several stages of the streamvae session failed", self.errors)

    def raise_if_undelivered(self) -> None:
        """Raise the failure if no caller has seen it yet (the session's block ended without an error)."""
        if not self._delivered:
            self.raise_if_failed()
