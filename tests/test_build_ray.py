"""`build --runner ray`: parsing and embedding on Ray Data actor pools while this process keeps the store
writes, the generation switch and the crash points.

- a Ray build SIGKILLed mid-embedding (``MGEO_INDEX_CRASH_AT=embedding``) and then re-run ends in the same
  catalog as an uninterrupted local build: entries, ids and parsed elements identical, vectors within
  ``TOLERANCE``, resolve answering identically, ``check`` clean. The killed build parsed every entry on
  Ray, the re-run embeds every entry on Ray, so both steps are compared with the local engine;
- the options are checked before anything is stored, each failure one clear line.

Ray is started once for the module (2 CPUs); the killed build joins it with ``--ray-address`` from a child
process, as a second driver.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_index
from typer.testing import CliRunner

pytest.importorskip("ray.data", reason="ray[data] is not installed: the Ray build engine is not tested")

from mgeo_index import settings, store  # noqa: E402
from mgeo_index.compute import ray as ray_pool  # noqa: E402
from mgeo_index.catalog.build import build  # noqa: E402
from mgeo_index.catalog.consistency import catalog_state# noqa: E402
from mgeo_index.cli import app  # noqa: E402
from mgeo_index.query.resolver import open_resolver  # noqa: E402
from mgeo_index.catalog.update import add, check  # noqa: E402

pytestmark = pytest.mark.slow  # Ray start-up and actor pools: tens of seconds

# Both engines embed the same batches (one chunk per actor call) with the default backend (int8 by rows; FP32
# before), which is batch-independent: the vectors agree to float rounding; this bounds thread-count effects.
TOLERANCE = 1e-5
CHUNK = 64  # 300 sample rows → 5 batches per step, spread over the 2 actors
QUERIES = ["深圳南山中山路75号东方科技园", "北京海淀东风路127号东方大厦", "南京鼓楼中山路89号星河广场"]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["mgeo_index.catalog.build"])


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray for this module (2 CPUs); its GCS address, for a second driver to join."""
    ray = ray_pool.import_ray()
    if ray.is_initialized():
        ray.shutdown()
    ray_pool.start(ray, None, 2)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def local_build(tmp_path_factory) -> Path:
    """The sample catalog built by the local engine, in the same chunks as the Ray builds (read-only)."""
    index_dir = tmp_path_factory.mktemp("local") / "idx"
    build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device="cpu", chunk_size=CHUNK)
    return index_dir



def _answers(index_dir: Path) -> list[list[tuple]]:
    resolver = open_resolver(index_dir, device="cpu")
    try:
        return [[(m["id"], m["address"], m["label"], round(m["probability"], 4)) for m in row]
                for row in resolver.resolve(QUERIES, top_k=5)]
    finally:
        resolver.engine.dispose()


def _ray_writer(index_dir: str, address: str) -> None:
    os.environ["MGEO_INDEX_CRASH_AT"] = "embedding"
    build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device="cpu", chunk_size=CHUNK, runner="ray",
          ray_address=address, workers=2)


def test_ray_build_killed_mid_embedding_then_rerun_equals_a_local_build(tmp_path, ray_address, local_build):
    index_dir = tmp_path / "idx"
    child = _CONTEXT.Process(target=_ray_writer, args=(str(index_dir), ray_address))
    child.start()
    child.join(timeout=300)
    if child.is_alive():
        child.kill()
        pytest.fail("the Ray build did not reach kill point 'embedding' within 300 s")
    assert child.exitcode == -signal.SIGKILL
    with pytest.raises(FileNotFoundError, match="no complete index generation yet"):
        open_resolver(index_dir, device="cpu")
    engine = store.connect(settings.database_url(index_dir))
    catalog_id = store.catalog_id(engine, settings.DEFAULT_CATALOG)
    assert store.count_entries(engine, catalog_id) == 300  # rows committed before embedding
    from mgeo_index.text.parser import parser_version
    assert not any(store.entries_to_parse(engine, catalog_id, parser_version()))  # parsed on Ray, all committed
    engine.dispose()

    result = build(settings.SAMPLE_CATALOG, index_dir, id_column="poi_id", device="cpu", chunk_size=CHUNK,
                   runner="ray", workers=2)  # the same command: this process's Ray
    assert result.runner == "ray" and "ray start" in result.seconds
    assert (result.rows_inserted, result.entries_parsed, result.vectors_added, result.vectors_total) == (0, 0, 300, 300)
    assert check(index_dir).clean

    (entries, elements, vectors), (ray_entries, ray_elements, ray_vectors) = catalog_state(local_build), catalog_state(index_dir)
    assert ray_entries == entries and len(entries) == 300  # ids, catalog ids, addresses, normalized text
    assert ray_elements == elements
    assert sorted(ray_vectors) == sorted(vectors) == sorted(entries)
    assert max(float(np.abs(vectors[i] - ray_vectors[i]).max()) for i in vectors) <= TOLERANCE
    assert _answers(index_dir) == _answers(local_build)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def _one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_ray_options_are_refused_clearly_before_anything_is_stored(tmp_path, ray_address, local_build, monkeypatch):
    runner = CliRunner()
    index_dir = tmp_path / "idx"

    def cli_build(*options):
        return runner.invoke(app, ["build", str(settings.SAMPLE_CATALOG), "--index-dir", str(index_dir), "--device", "cpu",
                                   *map(str, options)])

    result = cli_build("--runner", "ray", "--workers", "0")
    assert result.exit_code == 2 and "Invalid value for '--workers'" in result.output and "Traceback" not in result.output
    with pytest.raises(ValueError, match="--workers must be at least 1, not 0"):
        build(settings.SAMPLE_CATALOG, index_dir, runner="ray", workers=0)
    with pytest.raises(ValueError, match="--gpus-per-worker is for --runner ray"):
        build(settings.SAMPLE_CATALOG, index_dir, workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="--workers must be at least 1, not 0"):
        build(settings.SAMPLE_CATALOG, index_dir, workers=0)
    assert "--runner must be local or ray, not 'spark'" in _one_error_line(cli_build("--runner", "spark"))
    assert "GPU actors (--gpus-per-worker) run torch" in _one_error_line(
        cli_build("--runner", "ray", "--gpus-per-worker", "1", "--backend", "int8"))

    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    line = _one_error_line(cli_build("--runner", "ray", "--workers", "2", "--gpus-per-worker", "1"))
    if gpus < 2:  # this machine: no GPU
        assert f"--gpus-per-worker 1 with 2 workers needs 2 GPUs; the local Ray (this machine) has {gpus:g}" in line

    address = f"127.0.0.1:{_closed_port()}"
    line = _one_error_line(cli_build("--runner", "ray", "--ray-address", address))
    assert f"cannot reach the Ray cluster at {address} (Connection refused)" in line
    add_dir = copy_index(local_build, tmp_path / "add")  # add takes the same options, checked the same way
    line = _one_error_line(runner.invoke(app, ["add", str(settings.SAMPLE_CATALOG), "--index-dir", str(add_dir),
                                               "--engine", "ray", "--ray-address", address]))
    assert f"cannot reach the Ray cluster at {address}" in line
    with pytest.raises(ValueError, match="--workers must be at least 1"):
        add(settings.SAMPLE_CATALOG, add_dir, runner="ray", workers=0)
    assert check(add_dir).clean and check(add_dir).generation_id == check(local_build).generation_id

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if Ray were not installed
    assert "Error: the Ray runner (--runner ray) needs Ray Data: pip install 'mgeo-index[ray]'" in _one_error_line(
        cli_build("--runner", "ray"))
    assert not (index_dir / "mgeo.db").exists()  # nothing was stored by any of them
