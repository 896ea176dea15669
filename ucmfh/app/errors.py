"""A user's mistake ends the program with one clear line and exit code 2, never a traceback.

The library raises ordinary exceptions whose messages name the file, the
dataset and the problem (``DataError``, ``CheckpointError``, ``ValueError``,
``FileNotFoundError``, ``FileExistsError``…); the front doors turn them into
one line here. Messages name no Python keyword: where a flag is the remedy,
the hint is added here, worded for the command line.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click

# What counts as bad input (or an environment the user must fix), not a bug of ucmfh.
USER_ERRORS = (ValueError, OSError, ImportError)
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # the shell's code for a run stopped by SIGINT


class UserError(click.ClickException):
    """One line on stderr, exit code 2 (click's own usage errors exit 2 too)."""

    exit_code = EXIT_USER_ERROR


def option_hint(setting: str, value: object) -> str:
    """A library setting as a command-line option: ``bad_images='skip'`` is ``--bad-images skip``."""
    flag = "--" + setting.replace("_", "-")
    return flag if value is True else f"{flag} {value}"


def describe(err: BaseException) -> str:
    """The one line shown for a user error, with its remedy worded as an option.

    A library error may carry ``remedy = (setting, value, effect)`` (``DataError``
    does): the setting under which the input would be accepted.
    """
    text = str(err) or type(err).__name__
    if isinstance(err, FileExistsError):
        text += " (pass --overwrite to replace it)"
    remedy = getattr(err, "remedy", None)
    if remedy is not None:
        setting, value, effect = remedy
        text += f"; use {option_hint(setting, value)} {effect}"
    return " ".join(text.split())


def interrupted(err: KeyboardInterrupt, always_resumes: bool = False) -> None:
    """End a command stopped by Ctrl-C (or a training run stopped by SIGTERM): one line on stderr saying how
    to go on, exit code 130. A training run's interrupt carries its saved state (``state_path``): the same
    command with --resume continues it (the same command alone, for one that ``always_resumes``: a grid);
    another's message says what was kept, or it is a plain Ctrl-C."""
    text = str(err) or "interrupted"
    if getattr(err, "state_path", None) is not None:
        text += f"; run the same command{'' if always_resumes else ' with --resume'} to continue"
    click.echo(text, err=True)
    sys.exit(EXIT_INTERRUPTED)


def user_errors(fn: Callable) -> Callable:
    """Decorator for click commands: report user errors as :class:`UserError`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except USER_ERRORS as err:
            raise UserError(describe(err)) from None
        except KeyboardInterrupt as err:
            interrupted(err)

    return wrapper
