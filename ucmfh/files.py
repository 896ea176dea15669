"""Files that are never seen half-written: atomic writes, locked appends, HDF5 attributes.

Every file ucmfh writes goes through here. A whole file is written under a
temporary name beside its destination (``.NAME.tmpPID.MACHINE``) and renamed
over it only when complete (:func:`atomic_file`), so a crash leaves the old
file or the new one, never a mixture. A temporary file left by a killed
process is removed the next time anything is written to the same destination.

JSON-lines files (results) grow by :func:`append_jsonl`: one ``O_APPEND``
write per row under an exclusive lock, so concurrent writers never lose or
interleave rows.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import gc
import hashlib
import io
import json
import os
import pickle
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
import warnings
import zipfile
import zlib
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ucmfh.printable import printable

try:  # POSIX advisory locks; elsewhere O_APPEND alone keeps each row whole
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

PathLike = Union[str, "os.PathLike[str]"]


def checked_path(where: str, path: Any, name: str = "path") -> str:
    """``path`` as a ``str``, where a public entry point (``where``) takes a file's path: a ``str`` or an
    ``os.PathLike`` of one; anything else (None, bytes) a ``TypeError`` naming both, where Python said 'expected
    str, bytes or os.PathLike object' and bytes made a dataset whose repr failed."""
    if isinstance(path, str) or (hasattr(path, "__fspath__") and isinstance(os.fspath(path), str)):
        return os.fspath(path)
    shown = f" {path!r}"[:80] if isinstance(path, bytes) else ""
    raise TypeError(f"{where}: {name} must be a file path (str or os.PathLike), got {type(path).__name__}{shown}")


def check_a_file(path: PathLike, what: str, error: type = ValueError) -> None:
    """Refuse, where ``what`` (a file: 'a checkpoint') is to be read, a folder, or a pipe or a device, whose opening
    waited for ever for a writer (a FIFO given as a dataset, a checkpoint or a results file hung the command, an
    index past SIGTERM): ``error`` naming ``path``. A regular file passes, and so does none (the caller says so)."""
    if os.path.isdir(path):
        raise error(f"{os.fspath(path)}: is a folder, not {what}")
    if os.path.exists(path) and not os.path.isfile(path):
        raise error(f"{os.fspath(path)}: is a pipe or a device (not a regular file), not {what}")


@functools.lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(functools.partial(f.read, 1 << 23), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(path: PathLike) -> str:
    """SHA-256 of a file's bytes, in hex (cached per path, size and modification time within a process): what
    a run records of its dataset, an index of its checkpoint and collection."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return _sha256(real, st.st_size, st.st_mtime_ns)


def check_space(path: PathLike, size: int) -> None:
    """Refuse to write about ``size`` bytes to ``path`` where its disk has not that much free (an OSError naming
    both): HDF5 found out while closing the file, and crashed the process (a segmentation fault). The nearest
    folder of ``path`` that exists is asked."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    free = shutil.disk_usage(folder).free
    needed = int(size * 1.02) + 2**20  # chunk and metadata overhead
    if needed > free:
        raise OSError(f"{os.fspath(path)}: needs about {needed / 2**20:.1f} MiB, and its disk has "
                      f"{free / 2**20:.1f} MiB free")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except OSError as err:
        return err.errno == errno.EPERM  # exists, but another user's
    return True


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    """This process's machine and process-id space, as 8 hex digits: its host name and (Linux) its pid namespace.
    A temporary file's pid means a process only here: a container's pid 40 is none on its host, whose writer
    took the container's file for a dead process's and removed it mid-write (an audit's find)."""
    try:
        space = os.readlink("/proc/self/ns/pid")
    except OSError:
        space = ""
    return f"{zlib.crc32(f'{socket.gethostname()} {space}'.encode()):08x}"


# .NAME.tmpPID, .NAME.tmpPID-THREAD, and since 2026-12 either with .MACHINE (8 hex digits) and 6 random ones
_TEMP = re.compile(r"^\.(.+)\.tmp(\d+)(?:-\d+)?(?:\.([0-9a-f]{8})[0-9a-f]{6})?$")
# a temporary file of another machine (or pid space) is left until untouched this long: its pid means nothing here
OTHER_MACHINE_STALE_S = 24 * 3600


def temp_destination(name: str) -> Optional[str]:
    """The file name a temporary file ``.NAME.tmp...`` (:func:`atomic_path`) is written for, else None."""
    match = _TEMP.match(os.path.basename(name))
    return match.group(1) if match else None


def _stale(directory: str, match: "re.Match[str]") -> bool:
    """Whether a temporary file's writer is gone: a process of this machine that no longer runs, or, for another
    machine's (a container's, a cluster node's on a shared disk), one untouched for a day."""
    if match.group(3) in (None, _machine()):  # a name without one: written before machines were named
        return not _pid_alive(int(match.group(2)))
    try:
        return time.time() - os.stat(os.path.join(directory, match.group(0))).st_mtime > OTHER_MACHINE_STALE_S
    except OSError:
        return False


def remove_stale_temps(path: PathLike) -> List[str]:
    """Remove the temporary files of ``path`` (:func:`atomic_path`) whose writer is gone (:func:`_stale`); return
    them."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _TEMP.match(name)
        if match and match.group(1) == os.path.basename(path) and _stale(directory, match):
            stale = os.path.join(directory, name)
            try:
                if os.path.isdir(stale) and not os.path.islink(stale):  # an index folder's save, killed: it stayed
                    shutil.rmtree(stale)
                else:
                    os.remove(stale)
                removed.append(stale)
            except OSError:
                pass
    return removed


def check_writable(path: PathLike, folder: bool = False) -> None:
    """Refuse, before any work, an output that could not be written: ``OSError`` naming ``path`` and why.

    A file (``folder=False``) is written beside itself and renamed (:func:`atomic_file`) or appended to,
    so its folder must take new files; a folder must be one, or be creatable under the nearest folder
    that exists. Whether a folder takes files is tried with a temporary file, removed at once (root
    ignores permission bits, a read-only mount does not): nothing is left behind.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.islink(path) and not os.path.exists(path):  # the write's link failed, said as another writer's race
        raise OSError(f"{path}: is a symbolic link to {os.readlink(path)}, which does not exist; not written through "
                      "it (give another name, or remove the link)")
    if os.path.isdir(path) and not folder:
        raise OSError(f"{path}: is a folder, not a file")
    if os.path.exists(path) and not folder and not os.path.isfile(path):  # a device, a pipe, a socket
        raise OSError(f"{path}: is not a regular file (a device, a pipe or a socket); not written")
    if os.path.exists(path) and folder and not os.path.isdir(path):
        raise OSError(f"{path}: is a file, not a folder")
    existing = path if folder and os.path.isdir(path) else os.path.dirname(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        folder_of = path if folder else os.path.dirname(path)
        raise OSError(f"{path}: cannot create the folder {folder_of} ({existing} is a file, not a folder)")
    _check_name_lengths(path, existing)
    try:
        fd, probe = tempfile.mkstemp(prefix=".ucmfh-probe-", dir=existing)
    except OSError as err:
        where = "" if existing == path else f" (in {existing})"
        raise OSError(f"{path}: cannot be written{where}: {err.strerror or err}") from None
    os.close(fd)
    os.remove(probe)
    # a file no one may write (mode 444, a shared dataset) is read-only to root too, who ignores the bits
    if os.path.isfile(path) and (not os.access(path, os.W_OK) or not os.stat(path).st_mode & 0o222):
        raise OSError(f"{path}: cannot be written: the file is read-only")


# the bytes a temporary name adds to its file's name: .NAME.tmpPID-THREAD.MACHINE (atomic_path), a pid and a thread
# id of up to 7 digits each, 8 + 6 hex digits; a lock's .NAME.lock adds fewer
TEMP_NAME_EXTRA = len("..tmp-.") + 2 * 7 + 8 + 6


def _check_name_lengths(path: str, existing: str) -> None:
    """Refuse a name (of the file, or of a folder still to be made on its way) longer than the file system holds
    once the temporary name's bytes are added (:data:`TEMP_NAME_EXTRA`): a legal name of 250 bytes could never be
    written, and the write failed after the work, naming the temporary file."""
    try:
        most = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    for name in os.path.relpath(path, existing).split(os.sep):
        size = len(os.fsencode(name))
        if size + TEMP_NAME_EXTRA > most:
            raise OSError(f"{path}: a name of {size} bytes ({name[:24]}…); at most {most - TEMP_NAME_EXTRA} here, as "
                          f"ucmfh writes it first under a temporary name up to {TEMP_NAME_EXTRA} bytes longer, and "
                          f"this file system holds names of {most}")


def check_not_input(path: PathLike, inputs: Dict[str, Union[PathLike, Sequence[PathLike], None]]) -> None:
    """Refuse, before any work and whatever ``--overwrite`` says, an output that is one of the command's own
    inputs: ``inputs`` maps each input's flag to its path (or paths); an output that is the same file as an
    input, or a path inside an input folder (an index), is a ``ValueError`` naming both."""
    path = os.fspath(path)
    real = os.path.realpath(path)
    for flag, given in inputs.items():
        for item in [given] if isinstance(given, (str, bytes, os.PathLike)) else (given or ()):
            item = os.fspath(item)
            if not os.path.exists(item):
                continue
            if os.path.isdir(item):  # an index folder: nothing of another kind is written into it, new or not
                inside = os.path.commonpath([real, os.path.realpath(item)]) == os.path.realpath(item)
                if inside:
                    raise ValueError(f"{path}: is inside {item}, an input of this command ({flag}); not written "
                                     "there, even with --overwrite")
            elif os.path.exists(real) and os.path.samefile(real, item):
                raise ValueError(f"{path}: is {item}, an input of this command ({flag}); not written over, even "
                                 "with --overwrite")


# The mark each kind of whole file ucmfh writes carries in its first bytes (:func:`check_replaceable`).
MARKS = {
    "page": b'<meta name="generator" content="ucmfh">',  # ucmfh search --html
    "table": b"<!-- generator: ucmfh -->",  # a grid's PREFIX.md
    "table-csv": b"dataset,method,loss,n_bits,protocol,",  # a grid's PREFIX.csv: its header
    "figure": b"Software\x00ucmfh",  # a PNG's text chunk (matplotlib's metadata)
    "figure-svg": b"<dc:title>ucmfh</dc:title>",  # an SVG's creator (matplotlib's metadata {"Creator": "ucmfh"})
    "metrics": b'{\n "generator": "ucmfh',  # ucmfh evaluate --metrics-out
}
KINDS = {"page": "results page", "table": "grid table", "table-csv": "grid table", "figure": "figure",
         "figure-svg": "figure", "metrics": "metrics file"}
_HEAD = 4096  # every mark stands within the first bytes


def check_replaceable(path: PathLike, kind: str, overwrite: bool = False) -> None:
    """Refuse, before any work, to replace a file that ucmfh did not write as ``kind`` (a key of
    :data:`MARKS`): ``FileExistsError`` naming it. A page, a table, a figure or a metrics file that an
    earlier run wrote at ``path`` is written again; any other file there is the user's, replaced only
    with ``overwrite`` (a dataset named as ``--html`` by a slip of the hand is never lost)."""
    path = os.fspath(path)
    if overwrite or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb") as f:
        head = f.read(_HEAD)
    if MARKS[kind] not in head:
        # one an older ucmfh wrote has no mark either (before 2026-11-27): said as a file without one, not as the user's
        raise FileExistsError(f"{path}: exists without the mark of a {KINDS[kind]} ucmfh wrote (the user's, or one of "
                              "a ucmfh before 2026-11-27, which had none); not replaced")


# the names of files of other kinds, which rows are never appended to, whether they exist or not: a results file
# named 'runs.h5' is read as a dataset by the next command given it
OTHER_KINDS = (".h5", ".hdf5", ".pt", ".pth", ".ckpt", ".npy", ".npz", ".png", ".svg", ".pdf", ".jpg", ".jpeg",
               ".html", ".htm", ".csv", ".md", ".py", ".gz", ".tgz", ".zip")
JSONL_NAMES = (".jsonl", ".ndjson", ".json")  # the names an empty file of the user's is taken for results by


def check_jsonl(path: PathLike, results: bool = False) -> None:
    """Refuse to append rows to a file that is not JSON lines (an HDF5 dataset, a picture, a text): a
    ``ValueError`` naming it. Refused by its name alone: a file named as another kind (:data:`OTHER_KINDS`),
    there or not, and an empty file not named as JSON lines (:data:`JSONL_NAMES`: a file of the user's made empty,
    ``notes.txt``). An absent file, an empty one so named, or one whose first line is a JSON object, passes;
    with ``results``, a JSON object with a dataset and a task, as every command's results row has."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix in OTHER_KINDS:
        raise ValueError(f"{path}: is named as a {suffix} file, not JSON lines; not appended to (give a .jsonl name)")
    if not os.path.isfile(path):
        return
    with open(path, "rb") as f:
        head = f.read(_JSONL_HEAD).lstrip()
    first, newline, _ = head.partition(b"\n")
    if not first and suffix not in JSONL_NAMES:
        raise ValueError(f"{path}: exists, empty or blank, and is not named as JSON lines (.jsonl); not appended "
                         "to (give a .jsonl name, or remove the file)")
    if not first:
        return
    try:
        text = first.decode("utf-8") if newline or len(head) < _JSONL_HEAD - 1 else None  # a whole first line
    except UnicodeDecodeError:
        text = "\x00"
    if b"\x00" in head or text == "\x00":
        raise ValueError(f"{path}: is not a JSON-lines results file (it holds binary data); not appended to")
    rows = None if text is None else _rows_of_line(text.strip())
    if text is not None and rows is None:
        # a first row cut short (a writer killed there: it begins as one) before a whole one: a results file
        # still, which read_jsonl reads, skipping it; any other first line is a text of the user's
        lines = [line for line in head.split(b"\n")[1:] if line.strip()]
        whole = len(head) < _JSONL_HEAD - 1 or len(lines) > 1  # the second line, whole in the head
        second = _rows_of_line(lines[0].decode("utf-8", "replace").strip()) if lines and whole else None
        if not text.lstrip().startswith("{") or not second:
            raise ValueError(f"{path}: is not a JSON-lines results file (line 1: {_shown(text.strip())}); "
                             "not appended to")
        text, rows = json.dumps(second[0]), second
    if results and rows and not any("dataset" in row and "task" in row for row in rows):  # another program's
        raise ValueError(f"{path}: holds JSON lines that are not results rows (line 1 has no dataset and task: "
                         f"{_shown(text.strip())}); not appended to")


_JSONL_HEAD = 64 * 1024  # a results row is far shorter


def _shown(text: str, width: int = 60) -> str:
    """A line of the user's file in a message: its control characters escaped (a NUL-filled tail, a terminal's
    escape), and cut at ``width``."""
    return printable(text if len(text) <= width else text[:width - 1] + "…")


def torch_file_problem(path: PathLike, err: BaseException) -> str:
    """Why ``torch.load`` could not read ``path``, in a few words (not torch's advice on ``weights_only``):
    what a user can act on. ``err`` is what it raised."""
    path = os.fspath(path)
    if isinstance(err, OSError) and err.strerror and (isinstance(err, PermissionError) or not os.path.isfile(path)):
        return err.strerror.lower()  # 'permission denied': not 'truncated', which the bytes unread cannot tell
    if os.path.getsize(path) == 0:
        with open(path, "rb") as f:  # a file the system sizes 0 may still hold bytes (/proc/self/status)
            return "an empty file" if not f.read(1) else "truncated, or not a file torch saved"
    if not zipfile.is_zipfile(path):  # what torch.save writes; a copy cut short has no central directory
        with open(path, "rb") as f:
            if f.read(8) == b"\x89HDF\r\n\x1a\n":  # given for -c: 'truncated, or not a file torch saved'
                return "an HDF5 file: a dataset, collection or codes file, not one torch saved"
        return "truncated, or not a file torch saved"
    if isinstance(err, pickle.UnpicklingError):  # weights_only refuses anything but tensors and plain values
        return "it holds objects other than tensors and plain values"
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return f"damaged: {first if len(first) <= 100 else first[:99] + '…'}"


def atomic_path(path: PathLike) -> str:
    """A temporary name beside ``path`` to write to before :func:`os.replace` (the folder is created):
    ``.NAME.tmpPID.MACHINE``, ``.NAME.tmpPID-THREAD.MACHINE`` in a thread other than the main one (runs side by
    side in threads: ``ucmfh grid --jobs N --workers threads``); MACHINE names this process's machine and pid
    space, then 6 random hex digits: two writers of one file never share one, on one machine or on several that
    share a disk (the same pid in two containers).

    Temporary files of ``path`` whose writer is gone are removed first (:func:`remove_stale_temps`).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    remove_stale_temps(path)
    thread = "" if threading.current_thread() is threading.main_thread() else f"-{threading.get_native_id()}"
    return os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}{thread}.{_machine()}"
                                   f"{secrets.token_hex(3)}")


@contextlib.contextmanager
def atomic_file(path: PathLike, replace: bool = True) -> Iterator[str]:
    """Yield a temporary path to write; on success it replaces ``path``, on any error it is removed. Without
    ``replace`` it becomes ``path`` only where no file is there by then (a hard link, which fails on one): a file
    another process wrote there since the caller looked (two commands started together) is kept, and
    ``FileExistsError`` says so."""
    path = os.fspath(path)
    tmp = atomic_path(path)
    try:
        yield tmp
        if replace:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except OSError as err:
        raise named_write_error(err, path) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_binary(path: PathLike, replace: bool = True) -> Iterator[BinaryIO]:
    """A buffer in memory to write bytes to, then written to ``path`` by :func:`atomic_file`: a full disk said as an
    ``OSError`` of the file (``torch.save`` said it as 'unexpected pos 6976 vs 6904', a RuntimeError and a
    traceback, writing to a path or to a file of its own)."""
    buffer = io.BytesIO()
    yield buffer
    # the view released however the write ends: one a full disk's error kept (in its traceback) beside the buffer
    # crashed CPython 3.12.1's garbage collector (a segmentation fault, the process gone)
    with atomic_file(path, replace) as tmp, open(tmp, "wb") as f, buffer.getbuffer() as view:
        f.write(view)


# what a write can meet that names no file ('[Errno 28] No space left on device'): said of the file being written
_WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)


def named_write_error(err: OSError, path: str) -> OSError:
    """``err``, met writing ``path``, as one line naming it where it named no file ('[Errno 28] No space left on
    device' said nothing of which output)."""
    if err.errno not in _WRITE_ERRORS or path in str(err):
        return err
    said = OSError(f"{path}: not written ({err.strerror or err}); a file there before is kept")
    said.errno = err.errno
    return said


def _link_new(tmp: str, path: str) -> None:
    """``tmp`` under the name ``path`` where nothing is there (``FileExistsError`` otherwise), atomically; where the
    file system has no hard links, a look and a rename, which two writers can still race."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(f"{path}: written by another process meanwhile; not replaced") from None
    except OSError:
        if os.path.exists(path):
            raise FileExistsError(f"{path}: written by another process meanwhile; not replaced") from None
        os.replace(tmp, path)


def write_text_atomic(path: PathLike, text: str) -> str:
    """Write a text file under its final name only once it is complete."""
    path = os.fspath(path)
    with atomic_file(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return path


def write_json_atomic(path: PathLike, value: Any) -> str:
    """Write ``value`` as indented JSON, atomically."""
    return write_text_atomic(path, json.dumps(value, indent=1, sort_keys=True) + "\n")


@contextlib.contextmanager
def locked(path: PathLike, hidden: bool = False, wait: bool = True, shared: bool = False,
           create: bool = True) -> Iterator[int]:
    """An exclusive advisory lock on ``PATH.lock`` (POSIX; a no-op elsewhere); yields nothing useful. ``hidden``:
    on ``.NAME.lock`` beside it, for a file in a folder of the user's (a results file), where the lock, left
    for the next writer, would otherwise sit in their listing. Without ``wait``, a lock another holds is
    ``BlockingIOError``. ``shared``: a lock others may hold too (not an exclusive one). Without ``create``, a
    lock file no one has made is no lock (a reader's: no writer has locked it, so none is under way)."""
    head, name = os.path.split(os.path.abspath(os.fspath(path)))  # 'x.index/' is the folder's
    lock = os.path.join(head, f".{name}.lock" if hidden else f"{name}.lock")
    if fcntl is None or not create and not os.path.exists(lock):  # pragma: no cover - fcntl: not POSIX
        yield -1
        return
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644) if create else os.open(lock, os.O_RDONLY)
    try:
        kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        fcntl.flock(fd, kind if wait else kind | fcntl.LOCK_NB)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def append_jsonl(path: PathLike, rows: List[Mapping[str, Any]]) -> None:
    """Append rows to a JSON-lines file: under a lock, one ``O_APPEND`` write per row.

    Concurrent writers (other processes, other runs) never lose or interleave rows; a file that is not
    JSON lines is refused (:func:`check_jsonl`), never written into.
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    lines = [(json.dumps(row, sort_keys=True) + "\n").encode("utf-8") for row in rows]
    with locked(path, hidden=True):
        check_jsonl(path)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if lines and size and os.pread(fd, 1, size - 1) != b"\n":  # a last line without its newline (an
                lines[0] = b"\n" + lines[0]  # editor's, or a killed writer's): the row starts a line of its own
            for line in lines:
                # a row cut short (a full disk) is taken back: the file as it was before it, not half a row that
                # every later read warns of
                try:
                    written = os.write(fd, line)
                except OSError as err:
                    os.ftruncate(fd, size)
                    raise OSError(f"{path}: a row not appended ({err.strerror or err}); the file is as it was "
                                  "before it") from None
                if written != len(line):
                    os.ftruncate(fd, size)
                    raise OSError(f"{path}: a row not appended (only {written} of its {len(line)} bytes were "
                                  "written: the disk is full?); the file is as it was before it")
                size += written
        finally:
            os.close(fd)


def _rows_of_line(text: str) -> Optional[List[Dict[str, Any]]]:
    """The rows (JSON objects) one line holds, in order, or None unless the whole line is rows (one, or
    several glued together by a writer that appended to a last line without its newline)."""
    decoder, rows, pos = json.JSONDecoder(), [], 0
    while pos < len(text):
        try:
            row, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        if not isinstance(row, dict):
            return None
        rows.append(row)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return rows


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused (as it was, after): rows parsed from JSON hold no cycles, but each
    collection walks every row read so far, which took two thirds of reading a lab's 100,000-row results file
    (24 s, now 8 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_jsonl(path: PathLike, on_skip: Optional[Callable[[str], None]] = None,
               containing: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """The rows of a JSON-lines file ([] when it does not exist). Rows glued onto one line (appended to a
    last line without its newline) are all read; a line after the first row that is not rows (an editor's, a
    killed writer's) is skipped and said to ``on_skip`` (default: a warning; past the first :data:`SKIPS_SAID`,
    one line counts the rest), and so is a first line that began as a row (a writer killed there) before one. A
    file that is not text, or whose first line is neither (a text file of the user's, not results), is a
    ``ValueError`` naming it. ``containing``: after the file's first row, only the lines that hold one of these
    texts are read (the others are passed over unread and unchecked): a grid looking for its own runs' rows
    (``'"KEY"'``) in a file of many; the first row is returned whatever it holds. It is read between the
    appends of :func:`append_jsonl`, never in the middle of one."""
    path = os.fspath(path)
    if not os.path.exists(path):
        return []
    check_a_file(path, "a JSON-lines results file")
    needles = None if containing is None else [text.encode("utf-8") for text in containing]
    rows: List[Dict[str, Any]] = []
    skipped: List[Tuple[int, str]] = []
    first: Optional[Tuple[int, str]] = None  # a first line that is not rows: skipped if it began as a row (a
    # writer killed there) and a row follows it; anything else is not a results file (a text of the user's)
    try:
        f = open(path, "rb")
    except OSError as err:  # one line naming the file and why, not '[Errno 13] Permission denied: ...'
        raise OSError(f"{path}: the results file cannot be read ({err.strerror or err})") from None
    # read between appends (append_jsonl's lock, shared here): half a row being appended was said to be a damaged
    # line, or a file whose first row it was refused
    with f, _no_cycle_collection(), locked(path, hidden=True, shared=True, create=False):
        for number, raw in enumerate(f, 1):
            if needles is not None and rows and not any(needle in raw for needle in needles):
                continue
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError(f"{path}: is not a JSON-lines results file (line {number} is binary data)") from None
            if not line:
                continue
            found = _rows_of_line(line)
            if found is None and rows:
                skipped.append((number, line))
            elif found is None and first is None and line.startswith("{"):
                first = (number, line)
            elif found is None or not found and first is not None:
                number, line = first or (number, line)
                raise ValueError(f"{path}: is not a JSON-lines results file (line {number}: {_shown(line)})")
            elif found:
                if first is not None and not rows:
                    skipped.append(first)
                rows += found
    if first is not None and not rows:
        raise ValueError(f"{path}: is not a JSON-lines results file (line {first[0]}: {_shown(first[1])})")
    _say_skipped(path, skipped, on_skip)
    return rows


# how many skipped lines a read names one by one; the rest are counted in one line
SKIPS_SAID = 5


def _say_skipped(path: str, skipped: List[Tuple[int, str]], on_skip: Optional[Callable[[str], None]]) -> None:
    """Say the lines a read skipped: the first :data:`SKIPS_SAID` one by one, then how many more (a file whose
    every line is damaged is said in a few lines, not thousands)."""
    messages = [f"{path}: line {number}: not a JSON row ({_shown(line)}); skipped"
                for number, line in skipped[:SKIPS_SAID]]
    if len(skipped) > SKIPS_SAID:
        messages.append(f"{path}: {len(skipped) - SKIPS_SAID} more line(s) that are not JSON rows (the last: line "
                        f"{skipped[-1][0]}); skipped")
    for message in messages:
        if on_skip is None:
            warnings.warn(message, stacklevel=3)
        else:
            on_skip(message)


# --------------------------------------------------------------- HDF5 attributes


def encode_attr(value: Any) -> Any:
    """A Python value as an HDF5 attribute: lists of strings as a string array, dicts as JSON text."""
    import h5py

    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return np.array(value, dtype=h5py.string_dtype())
    return value


def decode_attr(value: Any) -> Any:
    """An HDF5 attribute as a plain Python value (str, int, float, list)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return [decode_attr(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


# strings an HDF5 attribute holds at most: 16 bytes each in its object header, which holds 64 KiB (a file of
# HDF5's earliest format, as h5py writes by default)
ATTR_STRINGS_MAX = 4000


def write_attrs(obj: Any, attrs: Optional[Mapping[str, Any]], reserved: tuple = ()) -> None:
    """Set attributes of an h5py file or group; ``reserved`` names may not be given, nor a list of more than
    :data:`ATTR_STRINGS_MAX` strings (HDF5's own refusal names neither: 'object header message is too large')."""
    for key, value in (attrs or {}).items():
        if key in reserved:
            raise ValueError(f"attribute {key!r} is reserved")
        if isinstance(value, (list, tuple)) and len(value) > ATTR_STRINGS_MAX:
            raise ValueError(f"{obj.file.filename}: attribute {key!r}: {len(value)} values, more than an HDF5 "
                             f"attribute holds here (at most {ATTR_STRINGS_MAX})")
        obj.attrs[key] = encode_attr(value)


def read_attrs(obj: Any, skip: tuple = ()) -> Dict[str, Any]:
    """The attributes of an h5py file or group as plain Python values."""
    return {k: decode_attr(v) for k, v in obj.attrs.items() if k not in skip}
