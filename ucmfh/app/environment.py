"""What the program takes from its environment: where datasets live (``$UCMFH_DATA_DIR``), the kernels'
backend (``$UCMFH_NATIVE``) and torchrun's process group."""
from __future__ import annotations

import os
from typing import List, Tuple

import h5py

from ucmfh.app.errors import say
from ucmfh.config import PROTOCOLS
from ucmfh.files import PathLike, locked


def default_data_dir() -> str:
    """Where dataset names resolve to ``NAME.h5``: ``$UCMFH_DATA_DIR``, else (unset or empty) ``data``."""
    return os.environ.get("UCMFH_DATA_DIR") or "data"


def configure_from_env() -> None:
    """Apply the environment's settings to the library: ``UCMFH_NATIVE=0`` ranks on the torch path, ``1`` (or
    empty) as it chooses; another value is refused (a ValueError naming it), where it was taken as ``1``."""
    value = os.environ.get("UCMFH_NATIVE")
    if not value:
        return
    if value not in ("0", "1"):
        raise ValueError(f"UCMFH_NATIVE={value}: give 0 (rank on the torch path) or 1 (the compiled kernels where "
                         "they serve, the default)")
    from ucmfh.metrics import set_backend

    set_backend("torch" if value == "0" else "auto")


def torchrun_sizes() -> Tuple[int, int]:
    """``(WORLD_SIZE, LOCAL_WORLD_SIZE)`` of the environment torchrun sets (1, 1 outside it); a ValueError naming
    the variable where one is not a whole number."""
    world = _size("WORLD_SIZE", 1)
    return world, _size("LOCAL_WORLD_SIZE", world)


def _size(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} in the environment: torchrun sets it to a number of processes; unset "
                         "it to run one process") from None


# the commands that run as one of torchrun's ranks (docs/distributed.md); extraction's ranks are shards of their own
DISTRIBUTED = ("train-fusion", "train-hash", "train-seps", "grid")
# seconds a rank waits for the others to join before it says so
JOIN_SAID_AFTER = 10.0


def distributed_problem(command: str) -> str:
    """Why ``command`` cannot run under torchrun (``WORLD_SIZE`` > 1), or '': each rank ran the whole command,
    and each appended its rows to the results file (evaluate, rerank: a row as many times as ranks)."""
    world = torchrun_sizes()[0]
    if world > 1 and "RANK" not in os.environ:  # a rank 0 of its own: it waited for its peers without end
        return (f"WORLD_SIZE={world} is set in the environment, but not RANK: torchrun sets both for each of its "
                "processes; run under torchrun, or unset WORLD_SIZE to run one process")
    if world <= 1 or command in DISTRIBUTED or command == "extract":
        return ""
    return (f"'ucmfh {command}' runs in one process, not as torchrun's {world} ranks (each would do "
            f"the whole of it); run it without torchrun (distributed: {', '.join(DISTRIBUTED)} and extract)")


def join_process_group() -> None:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment): join the run's process group
    (gloo for CPU tensors, NCCL for CUDA ones), each rank on its own GPU (``LOCAL_RANK``), and
    silence the standard output of every rank but 0, which reports for all (docs/distributed.md).
    While it waits for the other ranks a signal ends it (Python's handlers never ran inside torch's wait:
    SIGINT and SIGTERM were ignored for as long as it lasted), and past :data:`JOIN_SAID_AFTER` seconds it
    says what it waits for (a rank started by hand, whose peers never come, waited in silence)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import atexit
    import signal
    import sys
    import threading

    import torch
    import torch.distributed as dist

    from ucmfh.distributed import use_local_gpu

    if not dist.is_initialized():
        use_local_gpu(int(os.environ.get("LOCAL_RANK", "0")))
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        said = threading.Timer(JOIN_SAID_AFTER, lambda: print(
            f"rank {os.environ.get('RANK', '?')}: waiting for torchrun's {os.environ['WORLD_SIZE']} processes to "
            f"join at {where} (Ctrl-C stops it)", file=sys.stderr, flush=True))
        said.daemon = True
        main = threading.current_thread() is threading.main_thread()
        handlers = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        said.start()
        try:
            dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        finally:
            said.cancel()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        atexit.register(_leave_process_group)
    if dist.get_rank() > 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process


def _leave_process_group() -> None:
    """At exit: wait for the other ranks (rank 0 may still be scoring), then leave the group; a rank
    that leaves while another still uses the connection can abort it."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        except RuntimeError:  # another rank ended first (an error it said, a kill): nothing to wait for
            pass
        finally:
            dist.destroy_process_group()


def protocols_of(protocol: str) -> Tuple[str, ...]:
    return PROTOCOLS if protocol == "both" else (protocol,)


def _is_path(name: str) -> bool:
    """Whether ``--dataset`` names a file (``x.h5``, ``dir/x``), not a dataset of ``--data-dir``."""
    return name.endswith((".h5", ".hdf5")) or os.sep in name


def _candidates(name: str, data_dir: PathLike) -> List[str]:
    """Where ``--dataset name`` is looked for, in order: a path here, then in ``data_dir`` (an absolute one
    only as it is); a name, ``DATA_DIR/NAME.h5``."""
    if _is_path(name):
        return [name] if os.path.isabs(name) else [name, os.path.join(os.fspath(data_dir), name)]
    return [os.path.join(os.fspath(data_dir), f"{name}.h5")]


def dataset_paths(name: str, data_dir: PathLike) -> List[str]:
    """The files ``--dataset name`` may stand for (:func:`resolve_dataset`) that are there, creating nothing: the
    inputs an output must not be (:func:`ucmfh.app.outputs.check_outputs`). Files only: a folder named as the
    dataset (``wiki/`` for a run's outputs of ``-d wiki``) is not one."""
    return [path for path in _candidates(name, data_dir) if os.path.isfile(path)]


def resolve_dataset(name: str, data_dir: PathLike) -> str:
    """The file for a dataset name (``DATA_DIR/NAME.h5``) or path (a relative one is looked for here, then
    in ``data_dir``); ``synthetic`` is created on first use."""
    if _is_path(name):
        tried = _candidates(name, data_dir)
        found = [path for path in tried if os.path.exists(path)]
        if not found:
            raise FileNotFoundError(f"{name}: no such dataset file"
                                    + (f" (nor {tried[1]} in --data-dir)" if len(tried) > 1 else ""))
        if os.path.isdir(found[0]):
            raise IsADirectoryError(f"{found[0]}: is a folder, not a dataset file")
        return found[0]
    if not name:
        raise ValueError("--dataset: an empty name; give a dataset name or an .h5 file")
    if not os.fspath(data_dir):
        raise ValueError("--data-dir: an empty path; give the folder of NAME.h5 dataset files")
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise NotADirectoryError(f"{os.fspath(data_dir)}: is a file, not a folder of NAME.h5 dataset files (--data-dir)")
    [path] = _candidates(name, data_dir)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a folder, not a dataset file")
    if os.path.exists(path):
        return path
    if name == "synthetic":
        from ucmfh.data.synthetic import make_synthetic  # imports torch: paid by a command that makes the file

        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # made once under a lock: commands started together (a job array) wait for the first to make it and read
        # it, where the second made it again and was refused ('written by another process meanwhile')
        with locked(path, hidden=True):
            if os.path.exists(path):
                return path
            make_synthetic(path)
        # a file of 100 MB in --data-dir, made without a word (an audit's, into a folder of its real datasets)
        say(f"note: made {path} ({os.path.getsize(path) / 1e6:.0f} MB), the synthetic dataset, once: read from there "
            "after")
        return path
    if os.path.isfile(name) and h5py.is_hdf5(name):  # a dataset file here without .h5 (a copy named wikicopy)
        return name
    if os.path.isfile(name):  # a file of another kind given as the dataset (features.npy): not DATA_DIR/NAME.h5
        raise FileNotFoundError(f"{name}: not a dataset file (an .h5 file of the format, docs/data.md); convert "
                                "yours with 'ucmfh convert' (npz: .npy or .npz features)")
    if not os.path.isdir(data_dir):  # not 'datasets there: none', which reads as an empty folder
        raise FileNotFoundError(f"{path}: no such dataset file, and no folder {os.fspath(data_dir)} (--data-dir, else "
                                "$UCMFH_DATA_DIR, else data); give the folder of NAME.h5 files or the file's path")
    from ucmfh.data.h5 import is_dataset_file

    found = sorted(f[:-3] for f in os.listdir(data_dir) if f.endswith(".h5")  # a codes file, say, is none
                   and is_dataset_file(os.path.join(data_dir, f)))
    raise FileNotFoundError(
        f"{path}: no such dataset file (datasets in {data_dir}: {found or 'none'}); "
        "convert yours with 'ucmfh convert', or use --dataset synthetic"
    )
