"""mgeo-index command line: thin commands that parse their options, make one library call and render it.

- :mod:`~mgeo_index.cli.options`: the options several commands share, and library defaults read lazily;
- :mod:`~mgeo_index.cli.errors`: known failures as one red line and exit code 1;
- :mod:`~mgeo_index.cli.render`: rich tables, progress bars, bench printing;
- the commands, by concern: :mod:`~mgeo_index.cli.index_commands` (build, add, remove, gc, check),
  :mod:`~mgeo_index.cli.query_commands` (resolve, parse, match), :mod:`~mgeo_index.cli.eval_commands`
  (eval pairs / retrieval, bench), :mod:`~mgeo_index.cli.serve_commands`, :mod:`~mgeo_index.cli.db_commands`,
  :mod:`~mgeo_index.cli.train_commands`, :mod:`~mgeo_index.cli.normalize_commands` (normalize, jobs),
  :mod:`~mgeo_index.cli.label_commands` (labels export / import).

Command modules import the library inside the commands, so ``mgeo-index --help``, ``parse``, ``jobs`` and
``db`` load neither FAISS, transformers nor the service stack.
"""
from __future__ import annotations

import typer

from mgeo_index.cli.style import Command, Group
from mgeo_index.cli import (
    adapt_commands, db_commands, eval_commands, index_commands, label_commands, normalize_commands, query_commands,
    review_commands, serve_commands, train_commands,
)

__all__ = ["app"]

app = typer.Typer(
    name="mgeo-index",
    cls=Group,
    help="Chinese address entity resolution: build a catalog index, resolve messy addresses, score pairs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Chinese address entity resolution: build a catalog index, resolve messy addresses, score pairs."""
    import atexit

    atexit.register(_quick_exit)


def _quick_exit() -> None:
    """At exit, leave the objects alive now to the operating system: the interpreter's last garbage
    collections over torch's objects took 0.3-0.4 s of every one-shot command. (Not where triton was loaded:
    its bindings then report every object they still hold.)"""
    import gc
    import sys

    if "triton" not in sys.modules:
        gc.freeze()


# Commands in the order `mgeo-index --help` lists them; it lists the groups (db, eval) after them.
for command in (
    index_commands.build, index_commands.add, index_commands.remove, index_commands.gc, index_commands.check,
    query_commands.resolve, query_commands.parse, query_commands.match,
    eval_commands.bench, serve_commands.serve, train_commands.train,
    normalize_commands.normalize, normalize_commands.jobs, review_commands.review, adapt_commands.adapt,
):
    app.command(cls=Command)(command)

db_app = typer.Typer(cls=Group, help="Database schema (Alembic migrations).", no_args_is_help=True)
db_app.command("upgrade", cls=Command)(db_commands.db_upgrade)
db_app.command("downgrade", cls=Command)(db_commands.db_downgrade)
db_app.command("current", cls=Command)(db_commands.db_current)
app.add_typer(db_app, name="db")

eval_app = typer.Typer(cls=Group, help="Measure match quality: pair classification, retrieval, the number and name test sets.", no_args_is_help=True)
eval_app.command("pairs", cls=Command)(eval_commands.eval_pairs)
eval_app.command("retrieval", cls=Command)(eval_commands.eval_retrieval)
eval_app.command("numbers", cls=Command)(eval_commands.eval_numbers)
eval_app.command("names", cls=Command)(eval_commands.eval_names)
app.add_typer(eval_app, name="eval")

labels_app = typer.Typer(cls=Group, help="Reviewers' labels as files (a, b, label).", no_args_is_help=True)
labels_app.command("export", cls=Command)(label_commands.labels_export)
labels_app.command("import", cls=Command)(label_commands.labels_import)
app.add_typer(labels_app, name="labels")
