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
