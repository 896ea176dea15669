"""Data-parallel training (ucmfh.distributed): 2 gloo processes under torchrun against one process."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.distributed import Group, current_group

from conftest import ROOT

WORKER = str(ROOT / "tests" / "distributed_worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT = 240  # seconds: a hung collective fails the test instead of hanging CI


def torchrun(*args: str, n: int = 2) -> list:
    """torchrun on this machine; ``--standalone`` picks a free port itself (no port probed, closed, then raced for)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), *args]


@pytest.fixture(autouse=True, scope="module")
def _torchrun_tmp(tmp_path_factory):
    """torchrun's own temporary folders (/tmp/torchelastic_*) go to pytest's, not /tmp."""
    ENV["TMPDIR"] = str(tmp_path_factory.mktemp("torchelastic"))


def start(cmd: list) -> subprocess.Popen:
    """Start ``cmd`` in a process group of its own (torchrun and its workers), its output piped."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV,
                            start_new_session=True)


def run(cmd: list, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run to the end, or kill the whole process group (torchrun and its workers) on timeout."""
    proc = start(cmd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_group_of_one_is_the_identity():
    group = current_group()
    assert (group.rank, group.world_size, group.is_main) == (0, 1, True)
    x = torch.randn(5, 3, requires_grad=True)
    assert group.local(x) is x and group.gather((x,), 5)[0] is x
    assert group.any(True, torch.device("cpu")) and not group.any(False, torch.device("cpu"))


def test_parts_of_a_batch_cover_it_once():
    for world in (2, 3, 4):
        for n in (1, 5, 13, 64):
            sizes = Group(0, world).sizes(n)
            index = torch.arange(n)
            parts = [Group(r, world).local(index) for r in range(world)]
            assert [len(p) for p in parts] == sizes and torch.equal(torch.cat(parts), index)


def test_two_ranks_give_the_one_process_gradient(tmp_path):
    """Every loss, each stage (SEPS too), by id and supervised: one step on 2 ranks × B/2 items (parts of 7
    and 6) has the parameter gradient of one process on B items; some cases run several steps."""
    from distributed_worker import main as one_process

    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    one_process(str(one))  # in this process (a group of one)
    ranks = run(torchrun(WORKER, str(two)))
    assert ranks.returncode == 0, ranks.stderr
    a, b = torch.load(one), torch.load(two)
    assert a.keys() == b.keys() and len(a) == 18
    for case in a:
        assert a[case].keys() == b[case].keys() and a[case], case
        # relative to the case's largest gradient: some are zero up to rounding (a softmax's bias)
        scale = max(grad.abs().max().item() for _, grad in a[case].values()) + 1e-12
        for name, (_, grad) in a[case].items():
            other = b[case][name][1]
            assert (grad - other).abs().max().item() <= 1e-5 * scale, (case, name)


SMALL = ["--method", "ucmfh", "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64", "--set", "hash.hidden=64",
         "--set", "fusion.dropout=0", "--set", "hash.dropout=0", "--batch-size", "32", "--device", "cpu", "--quiet",
         "-b", "16", "--protocol", "unimodal"]


def _rows(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_torchrun_train_hash_writes_once_and_matches_one_process(tmp_path, tiny_path):
    """`torchrun -m ucmfh train-hash` on 2 ranks: rank 0 alone writes the checkpoints and the results,
    which match a 1-process run of the same seed (the same global batches; dropout off). Two processes are
    another run than one (other dropout masks): in the same --out, the 2-rank run trains a checkpoint of its
    own, and its rows say how many processes trained it."""
    args = ["train-hash", "-d", tiny_path, *SMALL, "--epochs", "3", "--out", str(tmp_path / "runs")]
    single = CliRunner().invoke(main, [*args, "--results", str(tmp_path / "one.jsonl")])  # in this process
    assert single.exit_code == 0, single.output
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*.pt")}
    ranks = run(torchrun("-m", "ucmfh", *args, "--results", str(tmp_path / "two.jsonl")))
    assert ranks.returncode == 0, ranks.stderr
    assert ranks.stdout.count("results appended") == 1 and "reused" not in ranks.stdout  # only rank 0 reports
    [mine], [theirs] = _rows(tmp_path / "two.jsonl"), _rows(tmp_path / "one.jsonl")
    assert abs(mine["map_i2t"] - theirs["map_i2t"]) < 0.01 and abs(mine["map_t2i"] - theirs["map_t2i"]) < 0.01
    assert mine["run"] != theirs["run"] and mine["settings"]["hash"]["processes"] == 2
    assert mine["settings"]["fusion"]["processes"] == 2 and "processes" not in theirs["settings"]["hash"]
    # in this process (no torchrun): the summary's two lines, the runs apart; the checkpoint scored again, its run
    summary = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "one.jsonl"), "--results",
                                        str(tmp_path / "two.jsonl")])
    assert summary.exit_code == 0 and len([line for line in summary.output.splitlines() if "hashing" in line]) == 2, \
        summary.output
    scored = CliRunner().invoke(main, ["evaluate", "-c", mine["checkpoint"], "-d", tiny_path, "--device", "cpu",
                                       "--quiet", "--results", str(tmp_path / "again.jsonl")])
    assert scored.exit_code == 0 and _rows(tmp_path / "again.jsonl")[0]["run"] == mine["run"], scored.output
    trained = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*.pt")}
    assert all(trained[p] == t for p, t in before.items())  # the one-process run's checkpoints untouched
    new = [p for p in trained if p not in before]
    assert sorted(p.name for p in new) == ["fusion.pt", "hash16.pt"]
    meta = torch.load(next(p for p in new if p.name == "hash16.pt"), weights_only=False)["meta"]
    assert meta["world_size"] == 2
    # the trained weights, not only MAP: summation order alone, amplified by Adam,
    # moved them by 1.4e-4 at most here; other batches or a rank's part trained twice would not stay that
    # close. (A
    # uniformly scaled gradient, a gather without gradient, barely moves Adam's steps: the gradient
    # test above is the one that catches it.)
    for name in ("fusion.pt", "hash16.pt"):
        two, one = (torch.load(next(p for p in paths if p.name == name), weights_only=False)["state_dict"]
                    for paths in (new, list(before)))
        assert two.keys() == one.keys()
        worst = max((two[k].float() - one[k].float()).abs().max().item() for k in two)
        assert worst < 1e-3, (name, worst)


@pytest.mark.slow  # 32 s: three torchrun launches; one process's resume and torchrun's one-process result stay in the default suite
def test_torchrun_interrupted_then_resumed_equals_uninterrupted(tmp_path, tiny_path):
    """SIGINT to torchrun mid-run: the ranks stop at the same step, rank 0 saves the state; `--resume` on 2
    ranks ends with the results of an uninterrupted 2-rank run; in 1 process it is refused, naming torchrun."""
    # dropout on: each rank's own random state must be restored too
    small = ["fusion.dropout=0.1" if arg == "fusion.dropout=0" else arg for arg in SMALL]
    args = ["train-hash", "-d", tiny_path, *small, "--epochs", "40", "--fusion-epochs", "4", "--save-interval", "0"]
    # the uninterrupted reference runs beside the rest
    ref = start(torchrun("-m", "ucmfh", *args, "--out", str(tmp_path / "ref"), "--results", str(tmp_path / "ref.jsonl")))
    try:
        _interrupt_then_resume(args, tmp_path)
        _, stderr = ref.communicate(timeout=TIMEOUT)
    finally:
        if ref.poll() is None:
            os.killpg(ref.pid, signal.SIGKILL)
    assert ref.returncode == 0, stderr
    [mine], [theirs] = _rows(tmp_path / "r.jsonl"), _rows(tmp_path / "ref.jsonl")
    assert (mine["map_i2t"], mine["map_t2i"]) == (theirs["map_i2t"], theirs["map_t2i"])


def _interrupt_then_resume(args: list, tmp_path: Path) -> None:
    out, results = tmp_path / "runs", tmp_path / "r.jsonl"
    proc = start(torchrun("-m", "ucmfh", *args, "--out", str(out), "--results", str(results)))
    try:
        end = time.monotonic() + TIMEOUT
        while not list(out.rglob("hash16.state.pt")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "no training state appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "interrupted by" in stderr, stderr
    assert list(out.rglob("hash16.state.pt")) and not results.exists()
    refused = run([sys.executable, "-m", "ucmfh", *args, "--out", str(out), "--results", str(results), "--resume"])
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "a run's number of processes is part of its identity; resume it with torchrun --nproc-per-node 2")
    done = run(torchrun("-m", "ucmfh", *args, "--out", str(out), "--results", str(results), "--resume"))
    assert done.returncode == 0, done.stderr
    assert not list(out.rglob("*.state.pt"))


def test_torchrun_train_seps_writes_once(tmp_path):
    """`torchrun -m ucmfh train-seps` on 2 ranks: one checkpoint, one results row per database, by rank 0."""
    from conftest import token_splits
    from ucmfh.data.writer import write_dataset

    path = write_dataset(tmp_path / "tok.h5", token_splits(), attrs={"name": "tok"})
    args = ["train-seps", "-d", path, "--quiet", "--device", "cpu", "--epochs", "2", "--batch-size", "32",
            "--set", "embed_dim=32", "--set", "pair_chunk=256", "--out", str(tmp_path / "runs"),
            "--results", str(tmp_path / "r.jsonl")]
    ranks = run(torchrun("-m", "ucmfh", *args))
    assert ranks.returncode == 0, ranks.stderr
    [row] = _rows(tmp_path / "r.jsonl")
    assert row["stage"] == "seps-full" and row["database"] == "test" and row["epochs_run"] == 2
    [checkpoint] = (tmp_path / "runs").rglob("seps.pt")
    assert torch.load(checkpoint, weights_only=False)["meta"]["world_size"] == 2


def test_more_ranks_than_gpus_each_take_local_rank_modulo_the_gpus(monkeypatch):
    """On a one-GPU machine rank 1 set GPU 1 and died ("invalid device ordinal")."""
    from ucmfh.distributed import use_local_gpu

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for rank in (0, 1, 3):
        use_local_gpu(rank)
    assert chosen == [0, 0, 0]


@pytest.mark.parametrize("device, gpus, message", [
    ("cuda", 1, "torchrun started 2 processes on this machine, which has 1 GPU(s): NCCL needs one GPU per process; "
                "use --nproc-per-node 1, or --device cpu"),
    ("cuda:1", 2, "device 'cuda:1' under torchrun would put all 2 processes of this machine on one GPU"),
])
def test_cuda_under_torchrun_needs_one_gpu_per_process(monkeypatch, device, gpus, message):
    from ucmfh.app.environment import torchrun_sizes
    from ucmfh.distributed import check_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert torchrun_sizes() == (2, 2)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_device(torch.device(device), *torchrun_sizes())
    check_device(torch.device("cpu"), 2, 2)  # the CPU takes any number of ranks
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device(torch.device("cuda"), 2, 2)  # one GPU per process: fine
    check_device(torch.device(device), 1, 1)  # one process: any GPU
    check_device(torch.device("cuda"), 4, 2)  # two machines of two processes, each with two GPUs


def test_a_run_of_several_processes_has_folders_and_keys_of_its_own(monkeypatch):
    """Every stage's settings hold the number of processes beyond one, so the folders (a method without a fusion
    stage is named by its hashing settings alone) and the keys differ from one process's, which stay as they
    were; a checkpoint scored later keeps the count it was trained in."""
    from types import SimpleNamespace

    from ucmfh.app import identity
    from ucmfh.app.identity import Run, key_of
    from ucmfh.config import FusionConfig
    from ucmfh.methods import hash_config

    dataset = {"label": "d", "path": "/d.h5", "fingerprint": "0" * 64}
    runs = {}
    for n in (1, 2):
        monkeypatch.setattr(identity, "current_group", lambda n=n: SimpleNamespace(world_size=n))
        for method in ("two-tower", "ucmfh"):
            runs[n, method] = Run("out", dataset, FusionConfig(), hash_config(method, n_bits=16))
    for method in ("two-tower", "ucmfh"):
        one, two = runs[1, method], runs[2, method]
        assert one.hash_dir != two.hash_dir and key_of(one.hash_identity) != key_of(two.hash_identity)
        assert "processes" not in one.settings()["hash"] and two.settings()["hash"]["processes"] == 2
    monkeypatch.setattr(identity, "current_group", lambda: SimpleNamespace(world_size=1))
    scored = Run("out", dataset, None, hash_config("two-tower", n_bits=16), trained_in=2)
    assert scored.hash_path == runs[2, "two-tower"].hash_path


def test_under_torchrun_a_refusal_is_said_once_and_a_rank_left_alone_ends_in_one_line(tmp_path, monkeypatch):
    """Every rank checks the same options and files: each said the same refusal (N lines under N processes);
    rank 0 alone says it now, the others end with its exit code. A rank whose collective failed because another
    rank ended (an error that rank said, a kill) printed gloo's traceback of some 95 lines over rank 0's line: one
    line now. (Checked on two real ranks too, by hand: `torchrun --nproc-per-node 2 -m ucmfh train-hash --out
    FILE` says its error once.)"""
    import ucmfh.app.cli as cli

    (tmp_path / "afile").write_text("mine")
    args = ["train-hash", "-d", "x.h5", "--out", str(tmp_path / "afile")]
    said = {}
    for rank in (0, 1):
        monkeypatch.setattr(cli, "process_rank", lambda rank=rank: rank)
        said[rank] = CliRunner().invoke(main, args)
    assert said[0].exit_code == said[1].exit_code == 2
    assert said[0].output == f"Error: --out {tmp_path / 'afile'}: is a file, not a folder\n" and said[1].output == ""

    def gone(*args, **kwargs):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242")

    monkeypatch.setattr("ucmfh.app.hashing_cli.train_hash_cmd.callback", gone)
    ended = CliRunner().invoke(main, ["train-hash"])
    assert ended.exit_code == 1 and ended.output == \
        "rank 1: stopped: another rank ended (that rank says why, or was killed)\n"
    monkeypatch.setattr(cli, "process_rank", lambda: 0)  # rank 0's, where rank 1 was killed (out of memory, say)
    ended = CliRunner().invoke(main, ["train-hash"])
    assert ended.exit_code == 1 and ended.output == \
        "rank 0: stopped: another rank ended (that rank says why, or was killed)\n"


@pytest.mark.parametrize("argv", [["evaluate", "-c", "x.pt"], ["rerank", "-c", "x.pt", "--seps", "s.pt"],
                                  ["search", "IDX", "-q", "q.npy"], ["runs"]])
def test_a_command_of_one_process_is_refused_under_torchrun(monkeypatch, argv):
    """Under torchrun each rank ran evaluate or rerank whole and appended its rows: a row as many times as ranks
    (an audit's find). A command that is not distributed is refused before it does anything."""
    import ucmfh.app.cli as cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(cli, "process_rank", lambda: 0)
    # WORLD_SIZE alone, as a cluster's container sets it for every process: extract made itself shard 0 of 2 and
    # waited for the other without end; a training command waited for its peers to join (an audit's)
    alone = CliRunner().invoke(main, argv)
    assert alone.exit_code == 2 and alone.output == (
        "Error: WORLD_SIZE=2 is set in the environment, but not RANK: torchrun sets both for each of its processes; "
        "run under torchrun, or unset WORLD_SIZE to run one process\n")
    monkeypatch.setenv("RANK", "0")  # torchrun's
    refused = CliRunner().invoke(main, argv)
    assert refused.exit_code == 2 and refused.output == (
        f"Error: 'ucmfh {argv[0]}' runs in one process, not as torchrun's 2 ranks (each would do the whole of it); "
        "run it without torchrun (distributed: train-fusion, train-hash, train-seps, grid and extract)\n")
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert CliRunner().invoke(main, argv).output == (
        "Error: WORLD_SIZE='two' in the environment: torchrun sets it to a number of processes; unset it to run one "
        "process\n")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_rank_waiting_for_its_peers_says_so_and_a_signal_ends_it(signum):
    """A rank started without its peers waited in torch's rendezvous in silence, and ignored SIGTERM and SIGINT
    (its Python handlers cannot run there) until killed with -9: it says what it waits for, and a signal ends it."""
    import socket

    with socket.socket() as probe:  # rank 0 serves the rendezvous here; no peer ever comes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = ("import ucmfh.app.environment as e; e.JOIN_SAID_AFTER = 0.5; from ucmfh.app.cli import main; "
            "main(['train-hash', '-d', 'never.h5'])")
    env = {**ENV, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    try:
        import select

        assert select.select([proc.stderr], [], [], 30)[0], "nothing said in 30 s"  # within a second or so
        line = proc.stderr.readline()
        assert line == f"rank 0: waiting for torchrun's 2 processes to join at 127.0.0.1:{port} (Ctrl-C stops it)\n"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == -signum
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_under_torchrun_a_warning_is_said_by_rank_0_alone(monkeypatch, capsys):
    """Each rank reads the same files: a dataset's warning was said once a rank (an audit's find, two ranks: twice)."""
    import ucmfh.app.errors as errors

    for rank in (1, 0):
        monkeypatch.setattr(errors, "process_rank", lambda rank=rank: rank)
        errors.warn("3 of the 50 query items have the image features of a /train item")
    assert capsys.readouterr().err == "warning: 3 of the 50 query items have the image features of a /train item\n"
