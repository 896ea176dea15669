"""UCMFH-compatible front door: ``python demo.py --task 0..3 --dataset NAME --hash_lens N``.

Task 0 trains the fusion stage, task 1 the hashing stage (training the fusion
stage first when its checkpoint is missing), task 2 evaluates the saved fusion
model, task 3 the saved hashing model. The same calls as the ``ucmfh`` command.
UCMFH's own task 1 trains a fusion encoder from random weights with the heads,
not task 0's: ``--fusion_start random`` does so (docs/reference.md §2, "Departures").
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
from typing import NoReturn

from ucmfh.signals import (
    end_program, exit_stopped, hold_signals_while_importing, imports_of_a_program, run_as_program,
    terminate_as_interrupt, work_over,
)

# Run as a script, SIGTERM ends it as Ctrl-C does at any moment (one line, 143; 130 for Ctrl-C), the seconds of
# importing click and torch below included, where both were a traceback or a silent -15 (ucmfh/__main__.py does
# the same)
AS_SCRIPT = __name__ == "__main__"
if AS_SCRIPT:
    terminate_as_interrupt()
    hold_signals_while_importing("torch")
try:  # a signal ends it at once (raised inside a class body: a traceback, exit 1, or -2)
    with imports_of_a_program(True) if AS_SCRIPT else contextlib.nullcontext():
        from ucmfh.app.errors import (
            EXIT_USER_ERROR, USER_ERRORS, as_user_error, describe, escape_what_output_cannot_encode, interrupt_behind,
            interrupted, outlive_reader, plain_warnings,
        )
        from ucmfh.app.environment import configure_from_env, default_data_dir, protocols_of, resolve_dataset
        from ucmfh.app.experiment import evaluate_checkpoint, say_relevance, train_fusion_stage, train_hash_stage
        from ucmfh.app.identity import Run, RunOptions, dataset_identity
        from ucmfh.app.stage import check_interrupted, saved_epochs
        from ucmfh.app.options import DEFAULT_RESULTS, check_precision
        from ucmfh.app.table import report
        from ucmfh.app.outputs import check_outputs
        from ucmfh.config import AMP_MODES, NON_NEGATIVE, PROTOCOLS, SETTINGS, FusionConfig, HashConfig, Range
        from ucmfh.data.h5 import load_dataset
        from ucmfh.losses import LOSSES
        from ucmfh.methods import stage_configs
        from ucmfh.methods.ucmfh import FUSION_STARTS
        from ucmfh.training_state import state_path_of, state_paths
        from ucmfh.utils import resolve_device
except KeyboardInterrupt as stopped:
    if not AS_SCRIPT:
        raise
    exit_stopped(stopped)


def _in_range(kind, allowed: Range):
    """An argparse type: ``kind`` of the value, in the setting's range (:data:`ucmfh.config.SETTINGS`); argparse
    names the flag on an error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if value != value:  # nan: "must be at least 0, got nan" said nothing
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if value not in allowed:
            rule = allowed.broken_by(value)
            raise argparse.ArgumentTypeError(f"must be at least {allowed.low}, got {text}" if rule.startswith(">=") else
                                             f"must be {rule}, got {text}")
        return value
    return parse


_HASH = SETTINGS[HashConfig]  # each setting's range: the flags below refuse what the config would


# the other spelling of each flag that has one (UCMFH's flags have underscores, this script's own dashes): each
# read as its flag before parsing, so that an abbreviation (--batch) still names one flag, not two
SPELLINGS = {"--data_dir": "--data-dir", "--hash-lens": "--hash_lens", "--batch-size": "--batch_size",
             "--save_interval": "--save-interval", "--cuda-graph": "--cuda_graph", "--no-cuda-graph": "--no_cuda_graph",
             "--fusion-start": "--fusion_start"}


def parse_args(argv=None) -> argparse.Namespace:
    p = parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    argv = [SPELLINGS.get(name, name) + sep + value for name, sep, value in (a.partition("=") for a in argv)]
    args = p.parse_args(argv)
    vars(args).pop("_given", None)
    if args.task in (2, 3):  # options of training, which tasks 2 and 3 would take and ignore
        graph = "--cuda_graph" if args.cuda_graph else "--no_cuda_graph"  # the one given
        given = [flag for flag, on in (("--resume", args.resume), (graph, args.cuda_graph is not None),
                                       ("--save-interval", args.save_interval != RunOptions.save_interval)) if on]
        if given:
            p.error(f"argument {given[0]}: goes with --task 0 and 1 (training); --task {args.task} evaluates")
    if args.task in (0, 2) and args.fusion_start != "trained":  # the fusion stage alone: no heads to start it for
        p.error(f"argument --fusion_start: chooses task 1's fusion encoder (and the one task 3 evaluates); "
                f"--task {args.task} is the fusion stage's")
    return args


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for kind, action in ((None, _Store), ("store", _Store), ("store_true", _StoreTrue),
                             ("store_false", _StoreFalse)):
            self.register("action", kind, action)

    def error(self, message: str) -> NoReturn:
        """A mistake on the command line in one line, exit code 2, as the ``ucmfh`` command says it (no usage)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Once(argparse.Action):
    """A flag given a second time is refused (``--hash_lens 16 --hash_lens 32``), where argparse keeps the last
    silently: a run of other settings than the line reads; as the ``ucmfh`` command refuses it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        seen = vars(namespace).setdefault("_given", {})
        given = option_string if values is None or values == [] else f"{option_string} {values}"
        if self.dest in seen:
            parser.error(f"argument {option_string}: given twice ({seen[self.dest]}, then {given}); give it once "
                         "(only the last would count)")
        seen[self.dest] = given
        super().__call__(parser, namespace, values, option_string)


class _Store(_Once, argparse._StoreAction):
    pass


class _StoreTrue(_Once, argparse._StoreTrueAction):
    pass


class _StoreFalse(_Once, argparse._StoreFalseAction):
    pass


def parser() -> argparse.ArgumentParser:
    """UCMFH's command line. Its flags are UCMFH's (``--hash_lens``) and its own (``--data-dir``); either takes
    the other spelling too (:data:`SPELLINGS`)."""
    p = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", type=int, choices=[0, 1, 2, 3], default=1,
                   help="0 train fusion, 1 train hashing, 2 evaluate fusion, 3 evaluate hashing (default: 1)")
    p.add_argument("--dataset", default="synthetic",
                   help="NAME (DATA_DIR/NAME.h5) or path to an .h5 file (default: synthetic, made on first use)")
    p.add_argument("--data-dir", default=default_data_dir(),
                   help="folder of NAME.h5 files ($UCMFH_DATA_DIR, else data); also --data_dir")
    p.add_argument("--hash_lens", type=_in_range(int, _HASH["n_bits"]), default=HashConfig.n_bits,
                   help="code length in bits, 8..256 (default: %(default)s); also --hash-lens")
    p.add_argument("--epoch", type=_in_range(int, _HASH["epochs"]), default=None,
                   help="epochs (default: the reference's for known datasets, else 100)")
    p.add_argument("--batch_size", type=_in_range(int, _HASH["batch_size"]),
                   default=FusionConfig.batch_size, help="items a training step (default: %(default)s); also "
                                                         "--batch-size")
    p.add_argument("--loss", default=FusionConfig.loss, choices=sorted(LOSSES),
                   help="both stages' loss (default: %(default)s)")
    p.add_argument("--fusion_start", choices=FUSION_STARTS, default="trained",
                   help="task 1's fusion encoder: task 0's, trained first (trained), or one of random weights "
                        "trained with the heads, as UCMFH's release (random) (default: %(default)s); also "
                        "--fusion-start")
    p.add_argument("--seed", type=int, default=FusionConfig.seed,
                   help="the run's seed: weights, batches, dropout (default: %(default)s)")
    p.add_argument("--protocol", choices=["both", *PROTOCOLS], default="both",
                   help="what tasks 0-3 score: unimodal (cross-modal retrieval), fused (UCMFH's), or both (default)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present; the default), cpu, cuda, ...")
    p.add_argument("--amp", choices=AMP_MODES, default=None,
                   help="training's number format: none (float32, the default), bf16 (autocast of the forward pass) "
                        "or tf32 (a GPU's float32 matmuls on its tensor cores)")
    p.add_argument("--out", default="runs", help="root folder of runs, their checkpoints (default: %(default)s)")
    p.add_argument("--results", default=DEFAULT_RESULTS,
                   help="JSON-lines file results are appended to, '' for none (default: %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run of the same settings")
    p.add_argument("--save-interval", type=_in_range(float, NON_NEGATIVE),
                   default=RunOptions.save_interval, help="seconds between saves of the training state, 0 for every "
                                                          "epoch (default: %(default)g); also --save_interval")
    graph = p.add_mutually_exclusive_group()
    graph.add_argument("--cuda_graph", action="store_true", default=None,
                       help="on a GPU, replay each full batch's training step from a captured CUDA graph (the "
                            "default there), and say where a stage runs eagerly; also --cuda-graph")
    graph.add_argument("--no_cuda_graph", dest="cuda_graph", action="store_false", default=None,
                       help="run every training step eagerly; also --no-cuda-graph")
    return p


def _other_epochs(run: Run, args: argparse.Namespace) -> str:
    """Tasks 2/3 without a checkpoint of the asked settings: the one saved run of these settings with other
    epochs when --epoch was not given (the README trains with --epoch 20, then evaluates without it), else
    an error that names the epochs saved."""
    kind = "fusion" if args.task == 2 else "hash"
    wanted = run.fusion_path if kind == "fusion" else run.hash_path
    saved = saved_epochs(run, kind)
    if args.epoch is None and len(saved) == 1:
        [(epochs, path)] = saved.items()
        print(f"evaluating {path}: the saved run of these settings ({epochs} epoch{'s' * (epochs != 1)})")
        return path
    if saved:
        listed = " or ".join(f"--epoch {e}" for e in sorted(saved))
        raise FileNotFoundError(f"{wanted}: no checkpoint of these settings ({run.fusion_cfg.epochs} epoch"
                                f"{'s' * (run.fusion_cfg.epochs != 1)}); "
                                f"saved runs of them with other epochs: use {listed}")
    if any(os.path.exists(path) for path in state_paths(state_path_of(wanted))):  # interrupted: its state is saved
        raise FileNotFoundError(f"{wanted}: no checkpoint of these settings yet: its training was interrupted; "
                                f"finish it with --task {args.task - 2} --resume")
    raise FileNotFoundError(f"{wanted}: no checkpoint of these settings; train it first with --task {args.task - 2}")


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except KeyboardInterrupt as err:
        interrupted(err)
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1", "0"):  # torchrun: each process would train the run alone
        print("error: demo.py trains in one process; under torchrun run the ucmfh command: torchrun "
              "--nproc-per-node N -m ucmfh train-hash --method ucmfh ... (docs/distributed.md)", file=sys.stderr)
        return EXIT_USER_ERROR
    plain_warnings()  # ucmfh's warnings in one line each, as the ucmfh command says them (not a file, line and code)
    with outlive_reader():  # a reader gone (| head) ends the command once its work is done, as the ucmfh command
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        configure_from_env()
        resolve_device(args.device)
        # UCMFH's method: its hashing stage shares every training setting with its fusion stage
        fusion_cfg, [hash_cfg] = stage_configs("ucmfh", dataset=args.dataset, n_bits=[args.hash_lens], loss=args.loss,
                                               epochs=args.epoch, batch_size=args.batch_size, seed=args.seed,
                                               device=args.device, amp=args.amp,
                                               method_params={"fusion_start": args.fusion_start})
        check_precision(fusion_cfg, hash_cfg)
        opts = RunOptions(out=args.out, resume=args.resume, save_interval=args.save_interval,
                          cuda_graph=args.cuda_graph)
        check_outputs({"--results": args.results}, {"--out": args.out if args.task in (0, 1) else None})
        if args.task in (2, 3) and args.dataset == "synthetic" and \
                not os.path.exists(os.path.join(args.data_dir, "synthetic.h5")) and \
                not glob.glob(os.path.join(glob.escape(args.out), "synthetic-*")):  # before a 103-MB set is made
            raise FileNotFoundError(f"{args.out}: no run on the synthetic dataset to evaluate; train one first with "
                                    f"--task {args.task - 2}")
        path = resolve_dataset(args.dataset, args.data_dir)
        print(f"dataset: {path}")
        data = load_dataset(path)
        say_relevance(data, print)
        protocols = protocols_of(args.protocol)
        if args.task in (0, 1):
            check_interrupted([Run(args.out, dataset_identity(data), fusion_cfg, hash_cfg if args.task else None)],
                              opts)
        if args.task == 0:
            rows = train_fusion_stage(data, fusion_cfg, opts, protocols)
        elif args.task == 1:
            rows = train_hash_stage(data, fusion_cfg, hash_cfg, opts, protocols)
        else:
            run = Run(args.out, dataset_identity(data), fusion_cfg, hash_cfg)
            checkpoint = run.fusion_path if args.task == 2 else run.hash_path
            if not os.path.exists(checkpoint):
                checkpoint = _other_epochs(run, args)  # says which
            else:  # which model the figures are of, as the training tasks say of the one they save
                print(f"evaluating {checkpoint}")
            rows = evaluate_checkpoint(data, checkpoint, protocols, device=args.device, n_bits=args.hash_lens,
                                       out=args.out)
        report(rows, args.results)
    except (*USER_ERRORS, RuntimeError) as err:
        if (stop := interrupt_behind(err)) is not None:  # a Ctrl-C that cut a module's C set-up short
            interrupted(stop)
        mapped = as_user_error(err) if isinstance(err, RuntimeError) else err
        if mapped is err and isinstance(err, RuntimeError):
            raise  # a bug, shown whole
        options = {flag for action in parser()._actions for flag in action.option_strings}
        print(f"error: {describe(mapped, options)}", file=sys.stderr)  # a remedy only where demo.py has the flag
        return EXIT_USER_ERROR
    except KeyboardInterrupt as err:
        interrupted(err)
    return 0


if __name__ == "__main__":
    run_as_program()
    escape_what_output_cannot_encode()  # > out.txt on Windows: cp1252
    code = main()
    work_over()  # a signal from here to the process's end ends it at once, its output flushed
    end_program(code)  # not through the interpreter's teardown, where a signal killed it
