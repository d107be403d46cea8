"""``main``: parse, run the command, and report a problem with the input, or an interrupt, as one line."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import av

from streamvae._errors import NoEncoderError, SigningError
from streamvae.cli._inputs import CliError
from streamvae.cli._parser import build_parser
from streamvae.cli._signals import TERMINATED_STATUS, Terminated, sigterm_as_ctrl_c

# What a user's input (a codec option, an output path) or machine (no encoder that works) can make the
# decode raise; anything else is a bug and keeps its traceback.
_USER_ERRORS = (CliError, ValueError, TypeError, OSError, av.error.FFmpegError, NoEncoderError, SigningError)

#: The exit status of a run stopped by Ctrl-C (SIGINT): 128 + the signal's number, as shells report it.
_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status: 1 for a problem with the input, reported in one
    ``streamvae: error: …`` line on stderr, and 130 for Ctrl-C, reported as ``streamvae: interrupted``
    once the decode has stopped (its partial outputs removed, files that were there before untouched);
    SIGTERM stops it the same way, reported as ``streamvae: terminated``, 143."""
    try:
        with sigterm_as_ctrl_c():
            args = build_parser().parse_args(argv)
            status: int = args.run(args)
    except BaseException as error:
        if _interrupted(error):
            if any(isinstance(leaf, Terminated) for leaf in _leaves(error)):
                print("streamvae: terminated", file=sys.stderr)
                return TERMINATED_STATUS
            print("streamvae: interrupted", file=sys.stderr)
            return _INTERRUPTED
        reported = _user_error(error)
        if reported is None:
            raise
        print(f"streamvae: error: {_describe(reported)}", file=sys.stderr)
        return 1
    return status


def _leaves(error: BaseException) -> list[BaseException]:
    if not isinstance(error, BaseExceptionGroup):
        return [error]
    from streamvae.cli._runner import error_leaves

    return error_leaves(error)


def _interrupted(error: BaseException) -> bool:
    """Whether Ctrl-C stopped the run (a task group may carry it beside the cancellations it caused)."""
    return any(isinstance(leaf, KeyboardInterrupt) for leaf in _leaves(error))


def _user_error(error: BaseException) -> BaseException | None:
    """The error to report for ``error`` if the user's input caused it (a group: its first), else None."""
    leaves = _leaves(error)
    return leaves[0] if all(isinstance(leaf, _USER_ERRORS) for leaf in leaves) else None


def _describe(error: BaseException) -> str:
    if isinstance(error, av.error.FFmpegError):  # a codec option FFmpeg rejects
        text = f"the encoder failed: {error}"
    elif isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"  # an output path that cannot be written
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())  # one line, whatever the message held
