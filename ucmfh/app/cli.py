"""The ``ucmfh`` command: the click group. Its commands live in the modules they are made of, each imported
when it runs or shows its help (:data:`COMMANDS`), so that ``ucmfh --help`` and ``ucmfh runs`` start without
importing torch, which takes seconds; the commands that train or score import it."""
from __future__ import annotations

import difflib
import re
import sys
from importlib import import_module
from typing import Dict, List, Optional, Tuple

import click

from ucmfh.app.errors import (
    UserError, interrupted, outlive_reader, peer_gone, plain_warnings, process_rank, reader_gone, warn,
)
from ucmfh.app.environment import configure_from_env, distributed_problem, join_process_group
from ucmfh.signals import imports_of_a_program, terminate_as_interrupt, work_over

# name -> (the module and attribute that make the command, its line in 'ucmfh --help')
COMMANDS: Dict[str, Tuple[str, str]] = {
    "make-synthetic": ("ucmfh.app.data_cli:make_synthetic_cmd", "Write a deterministic synthetic dataset."),
    "validate": ("ucmfh.app.data_cli:validate_cmd", "Check a dataset, codes file or search collection."),
    "convert": ("ucmfh.app.data_cli:convert", "Convert released feature files into a dataset."),
    "extract": ("ucmfh.app.data_cli:extract", "CLIP features of images and captions into a dataset."),
    "methods": ("ucmfh.app.hashing_cli:methods_cmd", "List the hashing methods, their parameters and defaults."),
    "losses": ("ucmfh.app.hashing_cli:losses_cmd", "List the losses and their parameters."),
    "train-fusion": ("ucmfh.app.hashing_cli:train_fusion_cmd", "Task 0: train UCMFH's fusion encoder, score it."),
    "train-hash": ("ucmfh.app.hashing_cli:train_hash_cmd", "Task 1: learn codes by --method and score them."),
    "evaluate": ("ucmfh.app.hashing_cli:evaluate_cmd", "Tasks 2/3: score a checkpoint or a codes file."),
    "encode": ("ucmfh.app.hashing_cli:encode_cmd", "Write a hashing checkpoint's codes to a file."),
    "grid": ("ucmfh.app.grid:grid", "Train and score datasets × methods × losses × lengths."),
    "runs": ("ucmfh.app.runs_cli:runs_cmd", "Summarise past runs: mean ± std over seeds."),
    "compare": ("ucmfh.app.compare:compare", "Two methods' paired differences, with intervals."),
    "train-seps": ("ucmfh.app.seps_cli:train_seps", "Train SEPS on a file's token features and score it."),
    "rerank": ("ucmfh.app.seps_cli:rerank", "Two-stage search: Hamming top-M, re-ranked by cosine or SEPS."),
    "index": ("ucmfh.app.search_cli:index_cmd", "Encode a collection into an index folder."),
    "search": ("ucmfh.app.search_cli:search_cmd", "Search an index: the top-k items of each query."),
}


class UsageInOneLine(click.ClickException):
    """A mistake on the command line said in one line, exit code 2 (click's own says it under the command's
    usage, a hint and a blank line); the message names the flag, and click's guess where a flag is unknown."""

    exit_code = 2

    def __init__(self, err: click.UsageError) -> None:
        super().__init__(err.format_message() + _flag_for_extra_file(err))


# the flags that take a file of each kind, for a file given without its flag ('ucmfh runs results.jsonl')
_FILE_FLAGS = ((".jsonl", ("--results",)), (".h5", ("--dataset", "--codes", "--queries")),
               (".pt", ("--checkpoint",)))


def _flag_for_extra_file(err: click.UsageError) -> str:
    """For one unexpected argument that names a file by its kind, the flags of the command that take such a
    file ('; give it as --results r.jsonl'), or ''; never a flag the command has not."""
    match = re.fullmatch(r"Got unexpected extra argument \((.+)\)", err.message)
    if match is None or err.ctx is None:
        return ""
    given = match.group(1)
    flags = {opt for param in err.ctx.command.params for opt in getattr(param, "opts", ())}
    if "--data-dir" not in flags:  # a --dataset that filters rows by a dataset's name ('runs'), not one to read
        flags.discard("--dataset")
    for suffix, takers in _FILE_FLAGS:
        if given.endswith(suffix):
            own = [flag for flag in takers if flag in flags]
            return f"; give it as {' or '.join(f'{flag} {given}' for flag in own)}" if own else ""
    return ""


class Commands(click.Group):
    """The ``ucmfh`` group: its commands are :data:`COMMANDS`, each imported when asked for, and listed by
    ``ucmfh --help`` without importing any (an unknown one is told the closest, 'did you mean'); a reader that
    closes the output early (``ucmfh runs | head -1``) ends every command quietly once its work is done, with
    the code that ends ``yes | head -1`` (:func:`ucmfh.app.errors.outlive_reader`); a mistake on the command
    line is one line (:class:`UsageInOneLine`; ``ucmfh`` alone still prints its help)."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted({*COMMANDS, *self.commands})  # and any added with add_command

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, name = COMMANDS[cmd_name][0].split(":")
        restore = terminate_as_interrupt()  # the import may take seconds (torch): a Ctrl-C or SIGTERM is one line
        try:
            with imports_of_a_program():  # a program ends at once (inside a class body: a traceback, exit 1)
                return getattr(import_module(module), name)
        except KeyboardInterrupt as err:  # Ctrl-C's, or SIGTERM's (which remembers its signal)
            interrupted(err)
        finally:
            restore()  # the command sets its own (main)

    def resolve_command(self, ctx: click.Context, args: List[str]):
        name = args[0] if args else ""
        names = self.list_commands(ctx)
        if name and not name.startswith("-") and name not in names and not ctx.resilient_parsing:
            close = difflib.get_close_matches(name, names, n=3)  # a typo's command ('trian-hash')
            ctx.fail(f"No such command {name!r}; " + (f"did you mean {' or '.join(map(repr, close))}?" if close
                                                      else f"the commands: {', '.join(names)}"))
        cmd_name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not ctx.resilient_parsing:
            refuse_repeated_options(cmd, cmd_name, rest, ctx)
        return cmd_name, cmd, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1] if name in COMMANDS else
                                 self.commands[name].get_short_help_str()) for name in self.list_commands(ctx)])

    def make_context(self, *args, **kwargs) -> click.Context:  # where 'ucmfh --help' prints
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:
            reader_gone()
        except click.UsageError as err:
            raise _in_one_line(err) from None
        except KeyboardInterrupt as err:  # parsing the line: click said 'Aborted!' and exit 1
            interrupted(err)

    def invoke(self, ctx: click.Context):
        try:
            try:
                with outlive_reader():
                    return super().invoke(ctx)
            except click.UsageError as err:
                raise _in_one_line(err) from None
        except BrokenPipeError:
            reader_gone()
        except KeyboardInterrupt as err:  # before the command's own guard: its options' checks (--device's imports
            interrupted(err)  # torch), where click said 'Aborted!' and exit 1
        except click.ClickException as err:  # under torchrun, said once, by rank 0
            if process_rank():
                sys.exit(err.exit_code)
            raise
        except RuntimeError as err:  # a collective's failure (under torchrun alone): rank 0's too, where rank 1 died
            if peer_gone(err):
                click.echo(f"rank {process_rank()}: stopped: another rank ended (that rank says why, or was killed)",
                           err=True)
                sys.exit(1)
            raise
        finally:  # a signal from here to the process's end ends it at once (click's exit and teardown said 'Aborted!')
            work_over()


def refuse_repeated_options(cmd: click.Command, name: Optional[str], args: List[str], parent: click.Context) -> None:
    """Refuse an option of one value given twice (``-d a.h5 -d b.h5``, ``--epochs 1 --epochs 2``), which click
    would settle silently by the last: a run of other settings than the user read on the line. Options that take
    several (``multiple``, ``count``) and eager ones (``--help``) may repeat. The line is parsed here as the
    command will parse it, its values left alone; a line the command will refuse anyway is left to it."""
    ctx = click.Context(cmd, info_name=name, parent=parent, resilient_parsing=True)
    try:
        _, _, order = cmd.make_parser(ctx).parse_args(args=list(args))
    except click.UsageError:
        return
    counts: Dict[click.Parameter, int] = {}
    for param in order:
        if isinstance(param, click.Option) and not (param.multiple or param.count or param.is_eager):
            counts[param] = counts.get(param, 0) + 1
    repeated = [param for param, count in counts.items() if count > 1]
    if repeated:
        param = repeated[0]
        names = " / ".join(repr(opt) for opt in (*param.opts, *param.secondary_opts))  # a flag's both spellings
        times = "twice" if counts[param] == 2 else f"{counts[param]} times"
        raise click.UsageError(f"Option {names} given {times}; give it once (only the last would count)", ctx)


def _in_one_line(err: click.UsageError) -> click.ClickException:
    """``err`` as :class:`UsageInOneLine`, but a bare ``ucmfh``'s request for help (click 8.2's NoArgsIsHelpError)."""
    return err if isinstance(err, getattr(click.exceptions, "NoArgsIsHelpError", ())) else UsageInOneLine(err)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ucmfh")
@click.pass_context
def main(ctx: click.Context) -> None:
    """ucmfh: deep cross-modal hashing on precomputed features: UCMFH, the field's methods and a leak-free default."""
    try:
        configure_from_env()
        problem = distributed_problem(ctx.invoked_subcommand or "")
    except ValueError as err:  # an environment variable set to what it cannot be (ours, or torchrun's)
        raise UserError(str(err)) from None
    plain_warnings()
    ctx.call_on_close(terminate_as_interrupt())
    if problem:
        raise UserError(problem)
    if ctx.invoked_subcommand != "extract":  # extraction's ranks are independent shards, never a group
        join_process_group()
    registry = sys.modules.get("ucmfh.methods.registry")  # imported by the command if it uses methods
    for name, why in getattr(registry, "PLUGIN_ERRORS", {}).items():  # another package's, installed and broken
        warn(f"method {name!r} of an installed package not loaded: {why}")  # rank 0's alone, in a group


if __name__ == "__main__":
    sys.exit(main())
