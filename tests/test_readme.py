"""The README's Python section runs as written (on a copy of the index scripts/demo.sh builds)."""
import re
import shutil
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_has_python_examples():
    assert len(python_examples()) >= 3


@pytest.mark.parametrize("number", range(len(python_examples())))
def test_readme_python_example_runs(number, sample_index, tmp_path, monkeypatch):
    if "pandas" in python_examples()[number]:
        pytest.importorskip("pandas")
    shutil.copytree(sample_index, tmp_path / "demo-index")
    monkeypatch.chdir(tmp_path)
    exec(compile(python_examples()[number], f"README.md python example {number + 1}", "exec"), {"__name__": "__readme__"})


DOCS = [README, *sorted((README.parent / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    """(file name, command line) of every ``mgeo-index …``, ``python scripts/…`` and ``python research/…`` line in the code blocks of
    README.md and docs/ (continuation lines joined, comments and a trailing ``&`` dropped)."""
    found = []
    for path in DOCS:
        if path.name == "cli.md":  # generated from --help
            continue
        blocks = re.findall(r"```[a-z]*\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
        blocks += re.findall(r"\n\n((?:    .*\n)+)", path.read_text(encoding="utf-8"))  # indented code blocks
        for block in blocks:
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = re.sub(r"\s+#.*$", "", line.strip().removeprefix("$ ")).removesuffix("&").strip()
                line = re.sub(r"^(?:[A-Z_]+=\S*\s+)+", "", line)  # OMP_NUM_THREADS=1 …
                words = line.split()
                script = len(words) > 1 and words[0].endswith("python") and words[1].startswith(("scripts/", "research/"))
                if words and (words[0] == "mgeo-index" or script):
                    found.append((path.name, line))
    return found


def test_the_docs_show_commands():
    assert len(documented_commands()) >= 30


@pytest.mark.parametrize("where,line", documented_commands())
def test_every_documented_command_names_real_commands_and_options(where, line):
    """Each mgeo-index line names a command that exists and only options that command has; each script exists."""
    import shlex

    import typer.main

    from mgeo_index.cli import app

    words = shlex.split(line)
    if words[0] != "mgeo-index":
        assert (README.parent / words[1]).is_file(), f"{where}: {line}: no {words[1]}"
        return
    command, rest = typer.main.get_command(app), words[1:]
    while rest and hasattr(command, "commands") and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
    assert not hasattr(command, "commands"), f"{where}: {line}: no such command"
    options = {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"--help"}
    for word in rest:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            assert word.split("=")[0] in options, f"{where}: {line}: {command.name} has no option {word}"
