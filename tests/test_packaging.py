"""What the package asks pip for: a lean CPU core, a torch range that admits the version the tests run on, extras
that never leave two FAISS builds installed, and the wheel as users get it (scripts/wheel_tour.py)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from mgeo_index import settings
from mgeo_index.index import faiss_index

tomllib = pytest.importorskip("tomllib")  # 3.11+: the tests read pyproject.toml as pip does

REPO = settings.PACKAGE_DIR.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements(names: list[str]) -> dict[str, Requirement]:
    return {(r := Requirement(line)).name.lower(): r for line in names}


def _pins() -> dict[str, Version]:
    lines = (REPO / "scripts" / "constraints.txt").read_text(encoding="utf-8").splitlines()
    return {(r := Requirement(line)).name.lower(): Version(next(iter(r.specifier)).version)
            for line in lines if line.strip() and not line.startswith("#")}


def test_the_core_is_what_a_cpu_needs_without_the_gpu_compiler_or_the_training_library():
    core = _requirements(PROJECT["dependencies"])
    assert "triton" not in core and "transformers" not in core
    assert "faiss-cpu" in core
    extras = {name: _requirements(lines) for name, lines in PROJECT["optional-dependencies"].items()}
    assert "triton" in extras["gpu"] and "transformers" in extras["train"]
    assert {"triton", "transformers"} <= set(extras["dev"])  # the tests run the kernels under TRITON_INTERPRET=1


def test_torch_is_a_range_that_admits_the_pinned_version_and_the_one_installed():
    torch_range = _requirements(PROJECT["dependencies"])["torch"].specifier
    assert not any(spec.operator in ("==", "===") for spec in torch_range), "an exact pin cannot sit beside a team's torch"
    pinned = _pins()["torch"]
    assert pinned in torch_range and Version("2.14.1") in torch_range
    import torch

    assert Version(torch.__version__.split("+")[0]) in torch_range


def test_no_extra_names_a_faiss_gpu_build_beside_the_cores_faiss_cpu():
    for name, lines in PROJECT["optional-dependencies"].items():
        assert not [r for r in lines if Requirement(r).name.lower().startswith("faiss-gpu")], name


def test_two_faiss_builds_installed_together_are_named_with_what_to_do(tmp_path):
    for folder in ("faiss_cpu-1.9.0.dist-info", "faiss_gpu_cu12-1.9.0.dist-info", "numpy-2.0.dist-info"):
        (tmp_path / folder).mkdir()
    builds = faiss_index.faiss_builds([str(tmp_path), str(tmp_path / "missing")])
    assert builds == ["faiss-cpu", "faiss-gpu-cu12"]
    message = faiss_index.faiss_clash(builds)
    assert "faiss-cpu and faiss-gpu-cu12 are installed together" in message
    assert "pip uninstall -y faiss-cpu faiss-gpu-cu12 && pip install faiss-gpu-cu12" in message
    assert faiss_index.faiss_clash(["faiss-cpu"]) is None
    assert faiss_index.faiss_builds() == ["faiss-cpu"]  # this environment: one build, no warning at import


def test_metadata_a_package_index_shows():
    assert PROJECT["license"] == "Apache-2.0" and (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert PROJECT["requires-python"] == ">=3.10"
    versions = {c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"] if re.fullmatch(r".*Python :: 3\.\d+", c)}
    assert min(versions, key=Version) == "3.10" and f"{sys.version_info.major}.{sys.version_info.minor}" in versions
    assert len(PROJECT["description"]) > 40 and PROJECT["readme"] == "README.md"


@pytest.mark.slow
def test_the_wheel_installs_alone_and_runs_the_tour_offline_then_serves(tmp_path):
    """scripts/wheel_tour.py: the wheel into a fresh venv outside the checkout, no extras; build → resolve →
    normalize → match → parse with the network out of reach; then the serve extra and one request."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "wheel_tour.py"), "--work", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # 1,215 MB measured (du); triton alone would add 999 MB, transformers 130, LightGBM with SciPy 153 (docs/install.md)
    assert report["site_packages_mb"] <= 1300, report
    assert report["faiss_builds"] == ["faiss-cpu"]
    assert set(report["tour_s"]) == {"build", "resolve", "normalize", "match", "parse", "serve"}


def test_training_without_transformers_names_the_train_extra(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from mgeo_index.cli import app

    monkeypatch.setitem(sys.modules, "transformers", None)  # what an install without the train extra looks like
    monkeypatch.delitem(sys.modules, "mgeo_index.training.train", raising=False)
    result = CliRunner().invoke(app, ["train", "--data", str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert "transformers is not installed: pip install 'mgeo-index[train]'" in " ".join(result.output.split())
    assert "Traceback" not in result.output
