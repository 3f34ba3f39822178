"""How the commands' help reads: usage lines with ``CATALOG``-style placeholders (``build [OPTIONS] CATALOG``,
``parse [OPTIONS] [TEXTS]...``), no type tag on a flag (``--json``, not ``--json <bool>``), where typer's rich
help writes ``{catalog}`` and ``<bool>``; options that take a value keep their type (``<path>``, ``<int>``). And
help paragraphs flow to the terminal's width: a docstring's line breaks inside a paragraph are spaces (typer's
rich help kept them, so an 80-column terminal broke every source line in two); a line starting ``- `` stays a line.

Through click's own hooks: every command and group is made with :class:`Command` / :class:`Group` (``cls=``),
which set each parameter's ``metavar`` and build the usage line from it (``collect_usage_pieces``).
"""
from __future__ import annotations

import inspect

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def _plain(params) -> None:
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""  # a flag takes no value
        elif isinstance(param, TyperArgument) and param.metavar is None:
            param.metavar = param.name.upper()


def unwrapped(text: str | None) -> str | None:
    """``text`` with each paragraph's line breaks made spaces (a paragraph starting with click's ``\\b`` is kept
    as written; a line starting with ``- `` stays a line)."""
    if not text:
        return text
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if paragraph.startswith("\b"):
            paragraphs.append(paragraph)
            continue
        lines = [line.strip() for line in paragraph.split("\n")]
        paragraphs.append("".join((("\n" if line.startswith("- ") else " ") if i else "") + line
                                  for i, line in enumerate(lines)))
    return "\n\n".join(paragraphs)


def _usage(command, ctx) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            name = param.metavar if param.required else f"[{param.metavar}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        else:
            pieces.extend(param.get_usage_pieces(ctx))
    return pieces


class _Plain:
    """What commands and groups share: plain placeholders and flowing help (the module's docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _plain(self.params)
        self.help = unwrapped(self.help)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        _plain([option] if option is not None else [])
        return option


class Command(_Plain, TyperCommand):
    def collect_usage_pieces(self, ctx) -> list[str]:
        return _usage(self, ctx)


class Group(_Plain, TyperGroup):
    def collect_usage_pieces(self, ctx) -> list[str]:
        return _usage(self, ctx) + [self.subcommand_metavar]
