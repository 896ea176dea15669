"""``ucmfh runs``: past runs from results files, summarised over seeds (:mod:`ucmfh.app.runs`), a run's
checkpoint or epoch history, and the scores against code length as figures. The summary imports no torch."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

import click

from ucmfh.app.errors import UserError, user_errors, warn
from ucmfh.app.options import complete_files, given_flags, results_to_read, row_filters
from ucmfh.app.outputs import check_figures, check_outputs
from ucmfh.app.runs import (filter_rows, format_summary, held_by, method_of, read_results, settings_key, summarize,
                            the_checkpoint, variant_of)


@click.command("runs")
@results_to_read
@row_filters
@click.option("--method", multiple=True,
              help="Only these methods (repeatable); METHOD@KEY: its runs of one settings key, as this command "
                   "shows them (or METHOD@STAGE.NAME=VALUE, as 'ucmfh compare' takes them).")
@click.option("--loss", multiple=True, help="Only these losses (repeatable).")
@click.option("--task", multiple=True, type=click.Choice(["fusion", "hashing", "seps", "rerank", "codes"]),
              help="Only rows of these tasks (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON lines.")
@click.option("--checkpoint", "checkpoint", is_flag=True,
              help="Print only the checkpoint of the one run that matches (for 'index -c', 'evaluate -c', ...); "
                   "an error when several match.")
@click.option("--plot", metavar="PREFIX", shell_complete=complete_files,
              help="Draw each dataset's scores against code length, one line per method: "
                   "PREFIX_<dataset>_<score>.png and .svg, a caption set's with _<database> after (a folder: "
                   "FOLDER/<dataset>_<score>.png; needs matplotlib).")
@click.option("--overwrite", is_flag=True, help="Replace a --plot file that is not a figure ucmfh wrote.")
@click.option("--history", metavar="RUN",
              help="Print a finished run's epoch history (loss, validation score, the epoch kept, the candidate "
                   "chosen, the refit) from its checkpoint: RUN is a checkpoint file or a run key (a prefix will do); "
                   "with --plot, draw it: PREFIX_history.png and .svg.")
@user_errors
def runs_cmd(results, dataset, n_bits, seed, k, protocol, method, loss, task, as_json, checkpoint, plot,
             overwrite, history) -> None:
    """Summarise past runs from results files: mean ± std over seeds, one line per setting."""
    if plot is not None and (as_json or checkpoint):
        raise click.UsageError(f"--plot does not go with {'--json' if as_json else '--checkpoint'}")
    if history is not None and checkpoint:
        raise click.UsageError("--history does not go with --checkpoint")
    if history == "":  # a prefix of every run key
        raise click.BadParameter("an empty run key; give a checkpoint file or a run key", param_hint="--history")
    if as_json and checkpoint:  # --checkpoint prints a path alone (for $(...)); --json was ignored
        raise click.UsageError("--json does not go with --checkpoint")
    if plot is not None:
        from ucmfh.metrics.plots import require_matplotlib

        require_matplotlib()  # a missing matplotlib is said before anything is read
        if not plot:
            raise click.BadParameter("an empty prefix; give the figures' path prefix (PREFIX_*.png)",
                                     param_hint="--plot")
        from ucmfh.metrics.plots import figure_prefix

        plot = figure_prefix(plot)
        check_outputs(folders={"--plot": os.path.dirname(os.path.abspath(plot))})
    missing = [path for path in results if not os.path.exists(path)]
    if history is not None and not os.path.isfile(history) and missing:
        raise click.BadParameter(f"{history}: no such checkpoint file, and no results file {missing[0]} to find a run "
                                 "key in", param_hint="--history")
    by_key = history is not None and not os.path.isfile(history)  # a run key: the lines that hold it alone are read
    found = read_results(results, warn, containing=['"' + history] if by_key else None) if history is None or by_key \
        else []
    sides = []
    if any("@" in name for name in method):  # a method's settings, as compare's (which imports torch)
        from ucmfh.app.compare import parse_side  # compare reads this module's summaries

        sides = [parse_side(name, "--method") for name in method if "@" in name]
    plain = tuple(name for name in method if "@" not in name)
    rows = filter_rows(found, dataset=dataset, method=() if sides else plain, loss=loss, n_bits=n_bits,
                       protocol=protocol, seed=seed, task=task, k=k)
    if sides:
        rows = [row for row in rows if method_of(row) in plain or any(side.holds(row) for side in sides)]
    if history is not None:
        def holds(held: List[Dict[str, Any]]) -> bool:
            return any(str(row.get("run", "")).startswith(history) for row in held)

        if by_key and holds(found) and not holds(rows):  # said as no such run at all
            filters = given_flags({"dataset": "--dataset", "method": "--method", "loss": "--loss",
                                   "n_bits": "--n-bits", "seed": "--seed", "k": "-k", "task": "--task",
                                   "protocol": "--protocol"})
            raise click.BadParameter(f"{history}: a run of {', '.join(results)}, but none of its rows passes the "
                                     f"filters given ({', '.join(filters)})", param_hint="--history")
        _print_history(history, rows, results, plot, overwrite, as_json)
        return
    if checkpoint:
        _print_checkpoint(rows, found, results)
        return
    groups = summarize(rows)
    if plot is not None:
        from ucmfh.app.length_plot import check_figure_paths, crowded, draw_length_figures, length_figures

        figures = length_figures(groups)
        if not figures:
            raise UserError("--plot: no run with a code length and a score matches; nothing drawn")
        check_figure_paths(plot, figures, overwrite)
        if crowded(figures):
            click.echo(crowded(figures), err=True)
        for path in draw_length_figures(figures, plot):
            click.echo(f"wrote {path}")
        return
    if not groups and found:  # the selection left nothing: what would match, on stderr (stdout is the table's alone,
        # which a script reads: a sentence there was read as data), exit 0 as a query that finds nothing
        click.echo(f"no runs match the selection; {', '.join(results)} holds: {held_by(found)}", err=True)
    elif as_json:
        for g in groups:  # one seed has no spread: null, not a 0.0 that reads as one measured (as the grid's CSV)
            click.echo(json.dumps({name: None if name.endswith("_std") and g["n_seeds"] < 2 else value
                                   for name, value in g.items()}, sort_keys=True))
    else:
        click.echo(format_summary(groups))


def _print_history(history: str, rows: List[Dict[str, Any]], results: Sequence[str], plot: Optional[str],
                   overwrite: bool, as_json: bool) -> None:
    """runs --history: a finished run's epochs, as a table, JSON lines or (with --plot) a figure."""
    from ucmfh.app.history import draw_history, format_history, history_figure, history_of, history_paths, history_rows

    try:
        path, epochs, trained_on, what = history_of(history, rows, ", ".join(results))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--history") from None
    if not history_rows(epochs):  # a method fitted in closed form (cca-itq) trains no epoch
        raise click.BadParameter(f"{path}: no epoch was trained (a method fitted in closed form has no history)",
                                 param_hint="--history")
    if plot is not None:
        check_figures("--plot", history_paths(plot), overwrite)
        for drawn in draw_history(history_figure(path, epochs, trained_on, what), plot):
            click.echo(f"wrote {drawn}")
    elif as_json:
        for row in history_rows(epochs):  # each row whole: which run, and the candidate it trained (the table's head)
            click.echo(json.dumps({**row, "checkpoint": path, "chosen": epochs.get("chosen")}, sort_keys=True))
    else:
        click.echo(format_history(path, epochs))


def _print_checkpoint(rows: List[Dict[str, Any]], found: List[Dict[str, Any]], results: Sequence[str]) -> None:
    """runs --checkpoint: the checkpoint of the one run the filters leave, or what would name one."""
    try:
        click.echo(the_checkpoint(rows, ", ".join(results)))
    except ValueError as err:  # the filters are the remedy
        held = f" ({', '.join(results)} holds: {held_by(found)})" if not rows and found else ""
        keys = sorted({f"{variant_of(row)}@{settings_key(row)[:6]}" for row in rows if row.get("checkpoint")})
        if len(keys) > 1:  # runs of several settings: a settings key names one, as 'ucmfh runs' shows them
            raise UserError(f"{err}, of settings {', '.join(keys)}; name one with --method {keys[0]} (and -d, "
                            "-b, --seed)") from None
        raise UserError(f"{err}{held}; name one run with -d, --task, --method, --loss, -b and --seed") from None
