"""A user's mistake ends the program with one clear line and exit code 2, never a traceback.

The library raises ordinary exceptions whose messages name the file, the
dataset and the problem (``DataError``, ``CheckpointError``, ``ValueError``,
``FileNotFoundError``, ``FileExistsError``…); the front doors turn them into
one line here. Messages name no Python keyword: where a flag is the remedy,
the hint is added here, worded for the command line.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import warnings
from typing import Any, Callable, Collection, Iterator, Optional

import click

from ucmfh.config import SettingError
from ucmfh.printable import printable
from ucmfh.signals import exit_stopped

# What counts as bad input (or an environment the user must fix), not a bug of ucmfh: a size asked for beyond
# the machine's memory (--resamples 99999999999) among them.
USER_ERRORS = (ValueError, OSError, ImportError, MemoryError)
EXIT_USER_ERROR = 2
EXIT_BROKEN_PIPE = 128 + 13  # the shell's code for a writer whose reader has gone (SIGPIPE), as ``yes | head``


class UserError(click.ClickException):
    """One line on stderr, exit code 2 (click's own usage errors exit 2 too)."""

    exit_code = EXIT_USER_ERROR


def option_hint(setting: str, value: object) -> str:
    """A library setting as a command-line option: ``bad_images='skip'`` is ``--bad-images skip``."""
    flag = "--" + setting.replace("_", "-")
    return flag if value is True else f"{flag} {value}"


def say(line: str) -> None:
    """A line of a command's log: a warning (``warning: ...``, indented too) on stderr, where diagnostics go and
    stdout keeps what a script reads; any other line on stdout."""
    click.echo(line, err=line.lstrip().startswith("warning: "))


def warn(message: str) -> None:
    """One line on stderr for something skipped that the user should know of (not a Python warning); under torchrun,
    rank 0's alone (each rank read the same files: every warning was said once a rank)."""
    if process_rank():
        return
    click.echo(f"warning: {message}", err=True)


def plain_warnings() -> None:
    """Python warnings of ucmfh's own as :func:`warn` lines (``warning: MESSAGE``), not as a source file's path,
    line and code; other packages' as Python shows them."""
    shown = warnings.showwarning
    if getattr(shown, "ucmfh", False):
        return
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../ucmfh

    def show(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(str(filename)).startswith(package + os.sep):
            warn(str(message))
        else:
            shown(message, category, filename, lineno, file, line)

    show.ucmfh = True
    warnings.showwarning = show


def has_option(flag: str) -> bool:
    """Whether the command running now has ``flag`` (``--overwrite``); outside a command, True (a library
    caller reads the hint as the setting's name)."""
    context = click.get_current_context(silent=True)
    if context is None:
        return True
    return any(flag in param.opts or flag in param.secondary_opts for param in context.command.params)


def describe(err: BaseException, options: Optional[Collection[str]] = None) -> str:
    """The one line shown for a user error, with its remedy worded as an option of the command running.

    A library error may carry ``remedy = (setting, value, effect)`` (``DataError``
    does): the setting under which the input would be accepted. A remedy is named only where the
    command has the option: a message never sends the user to a flag that is not there. ``options``: the
    flags of a front door that is not a click command (demo.py's), else those of the click command running.
    """
    has = has_option if options is None else options.__contains__
    text = str(err) or type(err).__name__
    if isinstance(err, MemoryError):
        text = f"not enough memory for what was asked ({text}); ask for less"
    if isinstance(err, SettingError):  # a setting refused while the work ran: said as the flag that set it
        for setting in err.settings:
            if has(option_hint(setting, True)):
                text = re.sub(rf"(?<![\w.-]){re.escape(setting)}\b", option_hint(setting, True), text)
    if isinstance(err, FileExistsError) and "not replaced" in text and has("--overwrite"):
        text += " (pass --overwrite to replace it)"
    remedy = getattr(err, "remedy", None)
    if remedy is not None:
        setting, value, effect = remedy
        if has(option_hint(setting, True)):
            text += f"; use {option_hint(setting, value)} {effect}"
    return printable(" ".join(text.split()))  # a file name's escape codes rewrote the terminal


def as_user_error(err: RuntimeError) -> RuntimeError:
    """torch's allocation failures (a CPU allocator that cannot allocate, CUDA out of memory: RuntimeErrors) as
    the MemoryError they are, a size asked for beyond the machine (``--set hash.hidden=2147483647``); any other
    RuntimeError as it is, a bug to show whole."""
    if type(err).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(err):
        return MemoryError(str(err).split("\n")[0])
    return err


def interrupt_behind(err: BaseException) -> Optional[KeyboardInterrupt]:
    """The Ctrl-C or SIGTERM an error was raised over, if any: a module whose C initialisation a signal's
    ``KeyboardInterrupt`` cut short is an ``ImportError('initialization failed')`` caused by it (pybind11's: a
    grid's worker importing scikit-learn as it was stopped ended the grid as a user error, exit 2)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def interrupted(err: KeyboardInterrupt, always_resumes: bool = False) -> None:
    """End a command stopped by Ctrl-C or SIGTERM: one line on stderr saying how to go on, and the shell's
    exit code of the signal (128 + its number: 130 for SIGINT, 143 for SIGTERM; an interrupt that names
    no signal, ``signum``, is Ctrl-C's). A training run's interrupt carries its saved state
    (``state_path``): the same command with --resume continues it. The same command alone continues one
    that ``always_resumes`` (a grid), whatever it was doing when stopped; another's message says what was
    kept, or it is a plain Ctrl-C. In a process group (torchrun's ranks of one run), rank 0 says it for every
    rank: each stops, and each said the same line, the others' 'training state saved' too, which rank 0 alone
    writes (extraction's shards are no group: each says its own)."""
    text = str(err) or "interrupted"
    if always_resumes or getattr(err, "state_path", None) is not None:
        text += f"; run the same command{'' if always_resumes else ' with --resume'} to continue"
    exit_stopped(err, "" if process_rank() else text)


def process_rank() -> int:
    """This process's rank in its process group (``torchrun``), 0 outside one. Rank 0 says for all what every rank
    would say: each checks the same options and files."""
    group = sys.modules.get("torch.distributed")  # imported by a command that joined a group, if any
    return group.get_rank() if group is not None and group.is_available() and group.is_initialized() else 0


def peer_gone(err: BaseException) -> bool:
    """Whether ``err`` is a collective operation's failure because another rank ended (gloo's words for it): that
    rank says why, or was killed; this one's traceback would bury it."""
    return isinstance(err, RuntimeError) and any(words in str(err) for words in (
        "Connection closed by peer", "Connection reset by peer"))


def reader_gone() -> None:
    """End a command whose standard output was closed by its reader (``ucmfh methods | head -1``): nothing
    more to say, and nowhere to say it; exit as a writer killed by SIGPIPE would (141), without
    Python's complaint about the output it could not flush."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind stdout (a test's capture): nothing to flush
        pass
    sys.exit(EXIT_BROKEN_PIPE)


class _Outlived:
    """A standard stream (output, error) that a closed reader does not stop: the first write that finds the reader
    gone sends this and every later write nowhere (:attr:`gone`); so does one that cannot be written at all (a
    full disk, ``> /dev/full``: :attr:`failed`, said once the work is done), where the command ended in a
    traceback; a stream closed before the command started (``>&-``) is written nowhere from the start. The rest is
    the stream's."""

    def __init__(self, stream: Any) -> None:
        self.original, self.failed = stream, None
        self.gone = stream is None
        self._stream = open(os.devnull, "w") if stream is None else stream  # noqa: SIM115 - for the process's life

    def write(self, text: Any) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._go()
            except OSError as err:
                self.failed = err
                self._go()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._go()
            except OSError as err:
                self.failed = err
                self._go()

    def _go(self) -> None:
        self.gone = True
        try:  # what the stream holds unwritten goes nowhere too, at its next flush (Python's, at exit)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no file descriptor behind it (a test's capture)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Lossy:
    """Standard error for a program's life: a write it has no room for (``2>/dev/full``) is lost, where click's
    message of an error raised OSError past the command's end (exit 1, and a teardown); a reader gone still raises
    (:func:`outlive_reader` hears it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: Any) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def lose_what_errors_cannot_write() -> None:
    """A program's standard error as :class:`_Lossy`; none (``2>&-``) as nowhere, where click wrote its errors
    into standard output instead, the user's file. The exit an error asked for stands."""
    sys.stderr = _Lossy(open(os.devnull, "w") if sys.stderr is None else sys.stderr)  # noqa: SIM115 - for life


def escape_what_output_cannot_encode() -> None:
    """A program's standard output writes a character its encoding lacks as its Python escape (``\\u2192``), as
    Python's own standard error does: redirected to a file on Windows (cp1252) or under a Latin-1 locale, the
    arrows and minus signs of ``ucmfh losses`` and ``compare``, or a Chinese caption of a search's hit, ended the
    command in a UnicodeEncodeError, a traceback or 'charmap codec can't encode', its output cut there."""
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


@contextlib.contextmanager
def outlive_reader() -> Iterator[None]:
    """Run a command whose work outlives a reader that closes its output early (``ucmfh train-hash ... | head``,
    ``| grep -m1 MAP``): its work goes on to its end (checkpoints, the rows appended to its results file, every
    code length), what it prints going nowhere once the reader is gone; then it exits as a writer killed by
    SIGPIPE would (141, :func:`reader_gone`). A write that found the reader gone ended the command there, and its
    rows with it. Standard error too: ``2>&1 | head`` sends the progress bars and warnings to the same reader."""
    stdout, stderr = _Outlived(sys.stdout), _Outlived(sys.stderr)
    sys.stdout, sys.stderr = stdout, stderr
    try:
        yield
    except (SystemExit, click.exceptions.Exit) as done:  # a command that ends by an exit (--help): its code
        sys.stdout, sys.stderr = stdout.original, stderr.original
        if getattr(done, "exit_code", getattr(done, "code", 0)) in (0, None):
            _outputs_lost(stdout, stderr)
        raise
    finally:
        sys.stdout, sys.stderr = stdout.original, stderr.original
    _outputs_lost(stdout, stderr)


def _outputs_lost(stdout: _Outlived, stderr: _Outlived) -> None:
    """After a command's work: exit 2 saying so where its output could not be written (a full disk), as a writer
    killed by SIGPIPE where its reader went (:func:`reader_gone`); nothing where an output was closed before the
    command began (``>&-``: written nowhere, as asked), or where standard error alone could not be written (its
    progress bars and warnings lost: the command's result stands)."""
    for stream in (stdout, stderr):  # what they hold: a full disk says so at the flush alone
        stream.flush()
    if stdout.failed is not None:
        if stderr.failed is None and stderr.original is not None:
            print(f"error: standard output: {stdout.failed.strerror or stdout.failed}; what the command wrote there "
                  "is lost", file=stderr.original, flush=True)
        sys.exit(EXIT_USER_ERROR)
    if any(s.gone and s.original is not None and s.failed is None for s in (stdout, stderr)):
        reader_gone()


def user_errors(fn: Callable) -> Callable:
    """Decorator for click commands: report user errors as :class:`UserError`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except BrokenPipeError:
            reader_gone()
        except USER_ERRORS as err:
            stop = interrupt_behind(err)
            if stop is not None:
                interrupted(stop)
            raise UserError(describe(err)) from None
        except RuntimeError as err:
            mapped = as_user_error(err)
            if mapped is err:
                raise
            raise UserError(describe(mapped)) from None
        except KeyboardInterrupt as err:
            interrupted(err)

    return wrapper
