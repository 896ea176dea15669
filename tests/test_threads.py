"""Runs side by side in threads of one process (``ucmfh grid --jobs N --workers threads``): what each keeps to
itself — its stop on a signal, its temporary files, its logs and capture block — and what they share, the TF32
setting, held until the last of them ends. (Their random draws: tests/test_run_draws.py.)"""
from __future__ import annotations

import contextvars
import os
import threading

import torch

from conftest import dead_pid
from ucmfh import signals
from ucmfh.amp import matmul_precision
from ucmfh.captured_step import capture_steps, capturing
from ucmfh.files import atomic_path, remove_stale_temps, temp_destination
from ucmfh.training_log import current_logs, current_part, logging_to, part


def _in_thread(work, *args):
    out, errors = {}, []

    def run():
        try:
            out["value"] = work(*args)
        except BaseException as err:  # noqa: BLE001 - raised in the test's thread
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if errors:
        raise errors[0]
    return out.get("value")


def test_a_loop_in_a_thread_stops_where_stop_threads_says_and_one_in_the_main_thread_does_not():
    inside, stopped = threading.Event(), threading.Event()

    def loop():
        with signals.stop_on_signals() as flag:
            inside.set()
            assert stopped.wait(60)
            return flag["signal"]

    with signals.stop_on_signals() as main_flag:
        out = {}
        thread = threading.Thread(target=lambda: out.update(signal=loop()))
        thread.start()
        assert inside.wait(60)
        signals.stop_threads(15)
        stopped.set()
        thread.join(60)
        assert out["signal"] == 15 and main_flag["signal"] is None
    assert not signals._IN_THREADS  # a loop that has ended is not stopped again


def test_two_threads_writing_one_file_write_temporary_files_of_their_own_which_are_known_as_such(tmp_path):
    target = tmp_path / "identity.json"
    main_temp = atomic_path(target)
    thread_temp = _in_thread(atomic_path, target)
    assert main_temp != thread_temp and os.path.dirname(main_temp) == os.path.dirname(thread_temp)
    assert temp_destination(main_temp) == temp_destination(thread_temp) == "identity.json"
    # a thread's temporary file left by a process that has ended is removed as a process's is
    dead = tmp_path / f".identity.json.tmp{dead_pid()}-77"
    dead.write_text("{")
    assert remove_stale_temps(target) == [str(dead)] and not dead.exists()


def test_tf32_is_kept_until_the_last_of_two_overlapping_runs_ends():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    first, second = matmul_precision("tf32"), matmul_precision("tf32")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first run ends while the second trains
    assert matmul.fp32_precision == "tf32"
    second.__exit__(None, None, None)
    assert matmul.fp32_precision == before


def test_a_thread_has_its_own_logs_part_and_capture_block_and_a_copy_of_its_starters_context_has_the_starters():
    class Log:
        def record(self, record):
            pass

        def close(self):
            pass

    log = Log()
    with logging_to(log), part("t0.3"), capture_steps(True):
        assert _in_thread(lambda: (current_logs(), current_part(), capturing())) == ((), "", False)
        copied = contextvars.copy_context()
        assert _in_thread(copied.run, lambda: (current_logs(), current_part(), capturing())) == ((log,), "t0.3", True)

        def own():
            with part("refit"), capture_steps(False):
                return current_part(), capturing()

        assert _in_thread(own) == ("refit", False)
        assert (current_logs(), current_part(), capturing()) == ((log,), "t0.3", True)  # the thread's left it so


def test_a_capture_refuses_every_thread_s_unsafe_calls_alone_and_the_capturing_thread_s_side_by_side():
    from ucmfh.captured_step import CudaGraphs
    from ucmfh.run_draws import separate_draws

    assert CudaGraphs().capture_error_mode == "global"  # a lone run: PyTorch's default
    with separate_draws():  # runs side by side in threads: another run's allocation during a capture is its own
        assert CudaGraphs().capture_error_mode == "thread_local"
        with separate_draws():  # a block of another thread ending leaves the first on
            pass
        assert CudaGraphs().capture_error_mode == "thread_local"
    assert CudaGraphs().capture_error_mode == "global"
