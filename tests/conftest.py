"""Shared fixtures.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined (i.e. before
``mgeo_index.runtime.kernels`` is imported anywhere), so it is set here, first: the Triton kernels then run
on the CPU through the interpreter and are exercised by every test that encodes or scores.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import shutil  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from mgeo_index import settings  # noqa: E402

SAMPLE = settings.SAMPLE_CATALOG

# Property tests check behaviour, not speed: no per-example deadline (on a loaded 2-core machine an example of
# normalize or parse can take 0.5 s, and Hypothesis would report that as a failure).
hypothesis_settings.register_profile("mgeo-index", deadline=None)
hypothesis_settings.load_profile("mgeo-index")


def pytest_collection_modifyitems(config, items):
    """Markers that follow from what a test needs: the PostgreSQL fixtures mark ``postgres``, the GPU
    module ``gpu``."""
    for item in items:
        if {"pg_url", "pg_database"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
        if item.path.name == "test_gpu.py":
            item.add_marker(pytest.mark.gpu)


def _tiny_bert(tokenizer, **extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id, **extra,
    )


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A random-weight tiny bi-encoder and cross-encoder (unit tests only; never shipped)."""
    from transformers import BertForSequenceClassification, BertModel

    from mgeo_index.model.bi_encoder import BiEncoder
    from mgeo_index.model.cross_encoder import CrossEncoder
    from mgeo_index.model.tokenizer import build_char_tokenizer

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny")
    texts = SAMPLE.read_text(encoding="utf-8").splitlines()
    tokenizer = build_char_tokenizer(texts, min_freq=1)
    bi = BiEncoder(BertModel(_tiny_bert(tokenizer), add_pooling_layer=False), tokenizer, projection_dim=16, max_length=64)
    bi.save(root / "bi")
    labels = settings.LABELS
    config = _tiny_bert(tokenizer, num_labels=3, id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
    CrossEncoder(BertForSequenceClassification(config), tokenizer, max_length=128, temperature=1.5).save(root / "cross")
    return root / "bi", root / "cross"


@pytest.fixture
def sample_catalog(tmp_path) -> Path:
    path = tmp_path / "sample_catalog.csv"
    shutil.copy(SAMPLE, path)
    return path


def _pg_admin_url() -> str:
    """URL of the ``postgres`` maintenance database, or skip the test saying why."""
    pytest.importorskip("psycopg2", reason="psycopg2 is not installed; PostgreSQL tests skipped")
    candidates = [os.environ.get("MGEO_INDEX_TEST_PG_ADMIN_URL")] + [
        f"postgresql+psycopg2://{user}@127.0.0.1:5432/postgres?connect_timeout=3" for user in ("postgres", "root")
    ]
    errors = []
    for url in filter(None, candidates):
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            return url
        except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
            errors.append(f"{make_url(url).username}: {str(exc).splitlines()[0]}")
        finally:
            engine.dispose()
    pytest.skip("PostgreSQL not reachable on 127.0.0.1:5432 (" + "; ".join(errors) + ")")


@contextmanager
def _fresh_pg_database() -> Iterator[str]:
    """A fresh, uniquely named PostgreSQL database, dropped afterwards."""
    admin_url = _pg_admin_url()
    name = f"mgeo_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture()
def pg_url() -> Iterator[str]:
    with _fresh_pg_database() as url:
        yield url


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """One fresh PostgreSQL database shared by a module (tests use distinct catalog names)."""
    with _fresh_pg_database() as url:
        yield url


def copy_index(source: Path, target: Path) -> Path:
    """A private copy of a built index directory (its SQLite store included)."""
    return Path(shutil.copytree(source, target))


@pytest.fixture(scope="session")
def sample_build(tmp_path_factory):
    """(index directory, BuildResult): the bundled sample catalog built once per session with the shipped
    models. Read-only: a test or module that writes to an index takes a copy (:func:`copy_index`)."""
    from mgeo_index.catalog.build import build

    index_dir = tmp_path_factory.mktemp("sample-index") / "idx"
    result = build(SAMPLE, index_dir, id_column="poi_id", device="cpu")
    return index_dir, result


@pytest.fixture(scope="session")
def sample_index(sample_build) -> Path:
    return sample_build[0]


@pytest.fixture
def sample_index_copy(sample_index, tmp_path) -> Path:
    """A private copy of :func:`sample_index` for a test that adds, removes or rebuilds."""
    return copy_index(sample_index, tmp_path / "idx")


@pytest.fixture(scope="session")
def tiny_index(tmp_path_factory, tiny_model_dirs) -> Path:
    """The sample catalog built once per session with the random-weight tiny bi-encoder (read-only)."""
    from mgeo_index.catalog.build import build

    path = tmp_path_factory.mktemp("tiny-index") / "idx"
    build(SAMPLE, path, id_column="poi_id", model=tiny_model_dirs[0], device="cpu")
    return path
