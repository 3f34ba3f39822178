"""`mgeo-index serve`: the endpoints through httpx (FastAPI's TestClient), limits and errors, the cache
(in-process and Redis), index reload, and one real uvicorn process (API key, overload, SIGHUP)."""
import asyncio
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from mgeo_index import settings  # noqa: E402
from mgeo_index.catalog import build as build_mod
from mgeo_index.query.match import score_sides
from mgeo_index.cli import app as cli_app  # noqa: E402
from mgeo_index.query.resolver import open_resolver  # noqa: E402
from mgeo_index.service import loader  # noqa: E402
from mgeo_index.service.app import ServeConfig, create_app  # noqa: E402
from mgeo_index.service.cache import LRUCache, RedisCache, cache_key, open_cache  # noqa: E402
from mgeo_index.text import normalize  # noqa: E402
from conftest import copy_index  # noqa: E402

Q1 = "深圳南山中山路75号东方科技园9号楼"
Q1_FULLWIDTH = "深圳南山中山路７５号东方科技园９号楼"  # normalizes to Q1
Q2 = "北京海淀燕园街道东风路127号东方大厦"
NEW_ADDRESS = "浙江省杭州市西湖区文三路478号华星时代广场A座"


@pytest.fixture(scope="module")
def built_index(sample_index, tmp_path_factory) -> Path:
    return copy_index(sample_index, tmp_path_factory.mktemp("serve") / "idx")


@pytest.fixture
def own_index(built_index, tmp_path) -> Path:
    """A copy of the built index (and its SQLite store) that a test may rebuild."""
    path = tmp_path / "idx"
    shutil.copytree(built_index, path)
    return path


def wait_ready(client, timeout=300.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get("/readyz")
        if r.status_code == 200:
            return r.json()
        assert r.status_code == 503 and "Retry-After" in r.headers
        assert r.json()["reason"] == "loading", r.json()
        time.sleep(0.2)
    raise AssertionError("not ready in time")


def metric(client, name: str, **labels) -> float:
    text = client.get("/metrics", headers=client.headers).text
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{[^}]*" + re.escape(selector) + r"[^}]*\}" if labels else "") + r" ([0-9.e+-]+)$"
    values = [float(m.group(1)) for m in re.finditer(pattern, text, re.M)]
    return sum(values)


@pytest.fixture(scope="module")
def client(built_index):
    config = ServeConfig(index_dir=built_index, max_batch=16, max_items=8, max_chars=64, max_body_bytes=2048)
    with TestClient(create_app(config)) as c:
        wait_ready(c)
        yield c


def test_health_ready_docs_and_metrics(client, built_index):
    assert client.get("/healthz").json() == {"status": "alive"}
    ready = client.get("/readyz").json()
    assert ready["ready"] is True and ready["entries"] == 300
    assert ready["build_id"] == str(json.loads((built_index / "index.json").read_text())["build_id"])
    assert client.get("/docs").status_code == 200
    assert {"/v1/resolve", "/v1/match"} <= set(client.get("/openapi.json").json()["paths"])
    assert metric(client, "mgeo_index_entries") == 300
    assert metric(client, "mgeo_index_build_info", build_id=ready["build_id"]) == 1
    assert "mgeo_queue_depth" in client.get("/metrics").text


def test_resolve_answers_with_the_json_of_resolve_json(client, built_index):
    cli = CliRunner().invoke(cli_app, ["resolve", Q1, "--index-dir", str(built_index), "--json", "--top-k", "3"])
    assert cli.exit_code == 0, cli.output
    r = client.post("/v1/resolve", json={"query": Q1, "top_k": 3})
    assert r.status_code == 200
    served, shown = r.json(), json.loads(cli.stdout)
    # the same answers; each says what computed it: a one-shot resolve takes the NumPy plan where the CPU has no
    # fast int8 or bf16 (AVX2), the service its torch plan
    assert set(served) == set(shown) and served.pop("plan").endswith("/blocked") and shown.pop("plan").endswith("/blocked")
    assert served == shown
    assert served["matches"][0]["source_id"] == "P0001"


def test_resolve_many_in_order_with_the_cache(client, built_index):
    body = {"queries": [Q2, Q1, Q1_FULLWIDTH], "top_k": 2, "explain": True}
    hits, misses = metric(client, "mgeo_cache_hits_total"), metric(client, "mgeo_cache_misses_total")
    first = client.post("/v1/resolve", json=body).json()["results"]
    assert [r["query"] for r in first] == body["queries"]
    assert first[1]["matches"] == first[2]["matches"]  # same normalized address, same answer
    assert "explain" in first[1]["matches"][0]
    assert metric(client, "mgeo_cache_misses_total") == misses + 3
    again = client.post("/v1/resolve", json=body, headers={"X-Priority": "bulk"}).json()["results"]
    assert again == first
    assert metric(client, "mgeo_cache_hits_total") == hits + 3
    # the cached answer is the resolver's own answer
    direct = open_resolver(built_index).resolve(body["queries"], top_k=2, explain=True)[0]
    assert json.loads(json.dumps(direct)) == first[0]["matches"]
    assert metric(client, "mgeo_batch_items_count") >= 1


def test_match_labels_pairs_like_the_engine(client, built_index):
    pairs = [{"a": "北京朝阳建国路88号", "b": "北京市朝阳区建国路88号"}, {"a": Q1, "b": "广州市天河区中山大道西1号"}]
    r = client.post("/v1/match", json={"pairs": pairs})
    assert r.status_code == 200
    results = r.json()["results"]
    resolver = open_resolver(built_index)
    expected, decided, _ = score_sides(resolver.cross, [normalize(p["a"]) for p in pairs], [normalize(p["b"]) for p in pairs])
    for pair, result, p, d in zip(pairs, results, expected, decided):
        assert (result["a"], result["b"]) == (pair["a"], pair["b"])
        probs = [result["probabilities"][label] for label in resolver.cross.labels]
        assert probs == pytest.approx(p.tolist(), abs=1e-5)
        assert result["label"] == resolver.cross.labels[int(d)]  # as `mgeo-index match --pairwise` labels it
        assert result["probability"] == max(probs)
    assert results[0]["probabilities"]["exact_match"] > results[1]["probabilities"]["exact_match"]


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({"queries": [Q1, "  ，。 "]}, ["body", "queries", 1], "empty"),
        ({"query": "北京" * 40}, ["body", "query"], "at most 64"),
        ({"query": 12345}, ["body", "query"], "string"),
        ({"queries": [Q1, ["nested"]]}, ["body", "queries", 1], "string"),
        ({"query": Q1, "queries": [Q2]}, ["body", "query"], "exactly one"),
        ({}, ["body", "query"], "exactly one"),
        ({"queries": []}, ["body", "queries"], "empty"),
        ({"query": Q1, "top_k": 0}, ["body", "top_k"], "greater than"),
        ({"query": Q1, "top_k": 101}, ["body", "top_k"], "at most 100"),
        ({"query": Q1, "retrieval": "magic"}, ["body", "retrieval"], "hybrid"),
        ({"query": Q1, "colour": "red"}, ["body", "colour"], "not permitted"),
    ],
)
def test_invalid_resolve_input_is_422_naming_the_field(client, body, loc, words):
    r = client.post("/v1/resolve", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"] == loc and words in d["msg"] for d in detail), detail


def test_invalid_match_input_and_headers_name_the_field(client):
    r = client.post("/v1/match", json={"pairs": [{"a": Q1, "b": Q2}, {"a": Q1, "b": " "}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pairs", 1, "b"]
    r = client.post("/v1/match", json={"pairs": [{"a": Q1}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pairs", 0, "b"]
    r = client.post("/v1/resolve", json={"query": Q1}, headers={"X-Priority": "urgent"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["header", "x-priority"]
    r = client.post("/v1/resolve", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert client.post("/v1/resolve", json={"query": Q2, "top_k": 1}).status_code == 200  # still serving


def test_too_large_is_413_and_the_server_keeps_serving(client):
    before = metric(client, "mgeo_rejected_requests_total", reason="too_large")
    r = client.post("/v1/resolve", json={"queries": [Q1] * 9})
    assert r.status_code == 413 and "at most 8" in r.json()["detail"]
    r = client.post("/v1/match", json={"pairs": [{"a": Q1, "b": Q2}] * 9})
    assert r.status_code == 413
    big = json.dumps({"queries": ["北" * 60] * 8}).encode()  # 2,900 bytes: over --max-body-bytes (2048)
    assert client.post("/v1/resolve", content=big, headers={"Content-Type": "application/json"}).status_code == 413

    def chunked():  # no Content-Length: counted while read
        for start in range(0, len(big), 512):
            yield big[start : start + 512]

    r = client.post("/v1/resolve", content=chunked(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "max-body-bytes" in r.json()["detail"]
    # every 413 counts: two over --max-items, two bodies over --max-body-bytes (by header and while read)
    assert metric(client, "mgeo_rejected_requests_total", reason="too_large") == before + 4
    assert client.post("/v1/resolve", json={"query": Q1, "top_k": 1}).status_code == 200


def test_deadline_is_504_and_the_server_keeps_serving(client):
    before = metric(client, "mgeo_rejected_requests_total", reason="deadline")
    r = client.post("/v1/resolve", json={"query": "上海市徐汇区漕溪北路1号", "top_k": 5}, headers={"X-Timeout-Ms": "1"})
    assert r.status_code == 504 and "deadline" in r.json()["detail"]
    assert "send fewer items a request (this one has 1)" in r.json()["detail"]  # what to do about it
    assert metric(client, "mgeo_rejected_requests_total", reason="deadline") == before + 1
    assert client.post("/v1/resolve", json={"query": "上海市徐汇区漕溪北路1号", "top_k": 5}).status_code == 200


def _append_and_rebuild(index_dir: Path, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.csv"
    text = settings.SAMPLE_CATALOG.read_text(encoding="utf-8")
    assert text.splitlines()[0] == "poi_id,name,address,city"
    catalog.write_text(text.rstrip("\n") + f"\nP9999,华星时代广场,{NEW_ADDRESS},杭州市\n", encoding="utf-8")
    build_mod.build(catalog, index_dir, id_column="poi_id")


def test_reload_swaps_the_index_while_serving_and_empties_the_cache(own_index, tmp_path):
    with TestClient(create_app(ServeConfig(index_dir=own_index, max_batch=4))) as c:
        old = wait_ready(c)
        assert c.post("/v1/admin/reload").json() == {"reloaded": False, "build_id": old["build_id"], "version": old["version"]}
        body = {"query": NEW_ADDRESS, "top_k": 3}
        before = c.post("/v1/resolve", json=body).json()
        assert "P9999" not in [m["source_id"] for m in before["matches"]]
        _append_and_rebuild(own_index, tmp_path)
        hits = metric(c, "mgeo_cache_hits_total")
        state = c.app.state.mgeo
        new_version = loader.index_version(own_index, state.loaded)
        assert new_version != old["version"]
        # an answer another server already computed on the new build (a shared cache) survives the reload
        shared_key = cache_key(f"{new_version}:{loader.ANSWER_FORM}", normalize("预先算好"), (2, True, False, "hybrid"))
        asyncio.run(state.cache.set_many({shared_key: []}))
        with ThreadPoolExecutor(4) as pool:  # requests keep coming while the new index loads
            during = [pool.submit(c.post, "/v1/resolve", json={"query": f"{Q2}{i}号", "top_k": 2}) for i in range(6)]
            reload = c.post("/v1/admin/reload").json()
            statuses = [f.result().status_code for f in during]
        assert statuses == [200] * 6
        assert reload["reloaded"] is True and reload["previous_build_id"] == old["build_id"] and reload["entries"] == 301, reload
        assert c.get("/readyz").json()["build_id"] == reload["build_id"] != old["build_id"]
        assert metric(c, "mgeo_index_build_info", build_id=reload["build_id"]) == 1
        assert metric(c, "mgeo_index_build_info", build_id=old["build_id"]) == 0
        after = c.post("/v1/resolve", json=body).json()
        assert after["matches"][0]["source_id"] == "P9999"  # computed on the new index, not the cached answer
        assert metric(c, "mgeo_cache_hits_total") == hits
        assert c.post("/v1/resolve", json={"query": "预先算好", "top_k": 2}).json()["matches"] == []  # kept, served
        assert metric(c, "mgeo_cache_hits_total") == hits + 1


def test_watch_picks_up_a_new_build(own_index, tmp_path):
    with TestClient(create_app(ServeConfig(index_dir=own_index, max_batch=2, watch_s=0.2))) as c:
        old = wait_ready(c)["build_id"]
        _append_and_rebuild(own_index, tmp_path)
        deadline = time.monotonic() + 300
        while c.get("/readyz").json()["build_id"] == old:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert c.get("/readyz").json()["entries"] == 301
        assert metric(c, "mgeo_index_reloads_total", outcome="reloaded") == 1


def _redis_url() -> str:
    redis = pytest.importorskip("redis", reason="redis client not installed")
    url = "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"Redis not reachable at {url}: {exc}")
    return url


def test_redis_cache_is_shared_and_emptied_on_reload(own_index):
    url = _redis_url()
    import redis

    r = redis.Redis.from_url(url)
    config = ServeConfig(index_dir=own_index, cache_url=url, max_batch=4)
    app = create_app(config)
    prefix = app.state.mgeo.cache.prefix
    try:
        with TestClient(app) as c:
            wait_ready(c)
            first = c.post("/v1/resolve", json={"query": Q1, "top_k": 2}).json()
            keys = r.keys(prefix + "*")
            assert len(keys) == 1
            assert json.loads(r.get(keys[0])) == first["matches"]
        with TestClient(create_app(config)) as c:  # a second server process shares the entries
            wait_ready(c)
            assert c.post("/v1/resolve", json={"query": Q1_FULLWIDTH, "top_k": 2}).json()["matches"] == first["matches"]
            assert metric(c, "mgeo_cache_hits_total") == 1
            assert c.post("/v1/admin/reload", params={"force": True}).json()["reloaded"] is True
            assert r.keys(prefix + "*") == []
    finally:
        keys = r.keys(prefix + "*")
        if keys:
            r.delete(*keys)


def _clear_keeps_the_new_version(cache) -> None:
    async def scenario():
        await cache.set_many({"7:index-7.faiss:a": [1], "8:index-8.faiss:b": [2], "8:index-8.faiss:c": [3]})
        await cache.clear(keep="8:index-8.faiss")  # what another process computed on the new index stays
        assert await cache.get_many(["7:index-7.faiss:a", "8:index-8.faiss:b", "8:index-8.faiss:c"]) == [None, [2], [3]]
        await cache.clear()
        assert await cache.get_many(["8:index-8.faiss:b", "8:index-8.faiss:c"]) == [None, None]

    asyncio.run(scenario())


def test_lru_cache_clear_keeps_the_new_version():
    lru = LRUCache(10)
    _clear_keeps_the_new_version(lru)
    assert len(lru) == 0
    with pytest.raises(ValueError, match="--cache-ttl is for the shared Redis cache"):
        open_cache(None, 10, "x", ttl_s=60)


def test_redis_cache_clear_keeps_the_new_version_and_entries_expire():
    url = _redis_url()
    import redis

    r = redis.Redis.from_url(url)
    prefix = f"mgeo-index:test-{os.getpid()}:"
    try:
        asyncio.run(RedisCache(url, prefix, ttl_s=60).set_many({"8:index-8.faiss:t": [1]}))
        assert 0 < r.ttl(prefix + "8:index-8.faiss:t") <= 60
        _clear_keeps_the_new_version(RedisCache(url, prefix, ttl_s=60))
        assert r.keys(prefix + "*") == []
    finally:
        keys = r.keys(prefix + "*")
        if keys:
            r.delete(*keys)


def test_redis_trouble_is_a_miss_and_counted():
    pytest.importorskip("redis", reason="redis client not installed")
    failed = []
    cache = RedisCache("redis://127.0.0.1:1/0", "mgeo-index:nowhere:", on_error=failed.append)

    async def scenario():
        assert await cache.get_many(["a", "b"]) == [None, None]
        await cache.set_many({"a": [1]})
        await cache.clear()
        await cache.close()

    asyncio.run(scenario())
    assert failed == ["read", "write", "clear"]
    with pytest.raises(ValueError, match="--cache-ttl"):
        open_cache("redis://127.0.0.1:6379/0", 10, "x", ttl_s=-1)


def test_unreachable_redis_stops_start_up(built_index):
    app = create_app(ServeConfig(index_dir=built_index, cache_url="redis://127.0.0.1:1/0"))
    with pytest.raises(RuntimeError, match="cannot reach the cache at redis://127.0.0.1:1/0"):
        with TestClient(app):
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: io.TextIOWrapper
    index_dir: Path


@pytest.fixture(scope="module")
def served(built_index, tmp_path_factory):
    """One real `mgeo-index serve` process (uvicorn, API key, --max-batch 1, --max-queue 2, no cache) on a
    copy of the built index, shared by the tests below in file order (the SIGHUP test rebuilds the index)."""
    root = tmp_path_factory.mktemp("uvicorn")
    own_index = root / "idx"
    shutil.copytree(built_index, own_index)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"MGEO_INDEX_API_KEY": "s3cret-key"}
    log = open(root / "server.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mgeo_index.cli", "serve", "--index-dir", str(own_index), "--port", str(port),
         "--max-batch", "1", "--max-queue", "2", "--cache-size", "0"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()
            try:
                if httpx.get(url + "/readyz").status_code == 200:  # health needs no key
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.3)
        yield Server(url=url, proc=proc, log=log, index_dir=own_index)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


API_KEY = {"X-API-Key": "s3cret-key"}


@pytest.mark.slow
def test_real_uvicorn_process_api_key(served):
    url = served.url
    assert httpx.get(url + "/healthz").status_code == 200
    assert httpx.post(url + "/v1/resolve", json={"query": Q1}).status_code == 401
    assert httpx.get(url + "/metrics", headers={"X-API-Key": "wrong"}).status_code == 401
    assert httpx.get(url + "/metrics", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
    assert httpx.post(url + "/v1/resolve", json={"query": Q1, "top_k": 1}, headers=API_KEY).json()["query"] == Q1


@pytest.mark.slow
def test_real_uvicorn_process_overload_is_429_and_the_server_keeps_serving(served):
    url = served.url

    async def flood(n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, headers=API_KEY, timeout=120) as http:
            queries = [f"{Q2[:-2]}{i}号" for i in range(n)]
            responses = await asyncio.gather(*(http.post("/v1/resolve", json={"query": q, "top_k": 2}) for q in queries))
            for q, r in zip(queries, responses):
                assert r.status_code in (200, 429), r.text
                if r.status_code == 200:
                    assert r.json()["query"] == q  # each caller gets its own answer
                else:
                    assert int(r.headers["Retry-After"]) >= 1
            return responses

    responses = asyncio.run(flood(24))
    codes = [r.status_code for r in responses]
    assert len(codes) == 24 and codes.count(200) >= 2 and codes.count(429) >= 1
    assert httpx.post(url + "/v1/resolve", json={"query": Q1, "top_k": 1}, headers=API_KEY).status_code == 200


@pytest.mark.slow
def test_real_uvicorn_process_sighup_reload(served, tmp_path):
    url, proc = served.url, served.proc
    old_build = httpx.get(url + "/readyz").json()["build_id"]
    _append_and_rebuild(served.index_dir, tmp_path)
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 300
    while httpx.get(url + "/readyz").json()["build_id"] == old_build:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.3)
    found = httpx.post(url + "/v1/resolve", json={"query": NEW_ADDRESS, "top_k": 1}, headers=API_KEY).json()
    assert found["matches"][0]["source_id"] == "P9999"
    served.log.seek(0)
    text = served.log.read()
    assert "index reloaded" in text
    assert Q1 not in text and NEW_ADDRESS not in text  # request texts stay out of the info log


def test_serve_without_an_index_says_how_to_build(tmp_path):
    result = CliRunner().invoke(cli_app, ["serve", "--index-dir", str(tmp_path / "nothing")])
    assert result.exit_code == 1
    assert "mgeo-index build" in result.output


def test_a_batch_confirms_its_fresh_answers_with_one_store_query_and_hands_the_cache_unconfirmed_ones(own_index, monkeypatch):
    """Fresh results get reviewers' decisions in the batch (one store query for all its items); the cache gets them
    as computed, since every cached answer is confirmed again per request."""
    from mgeo_index import settings, store
    from mgeo_index.text import model_text
    from mgeo_index.service import loader
    from mgeo_index.service.batcher import Submission

    loaded = loader.load(own_index)
    queries = ["南京鼓楼胜利路48号东方大厦", "北京海淀东风路127号东方大厦", "深圳南山中山路75号"]
    plain = loaded.resolver.resolve(queries, top_k=5, confirmed=False)
    chosen = plain[0][2]
    store.add_labels(store.connect(settings.database_url(own_index)),
                     [{"query": queries[0], "query_normalized": model_text(queries[0]), "entry_id": chosen["id"],
                       "entry_address": chosen["address"], "label": "exact_match"}], reviewer="ana")
    calls = []
    monkeypatch.setattr(store, "confirmations", lambda engine, texts, real=store.confirmations: calls.append(texts) or real(engine, texts))
    params = (5, True, False, "hybrid")
    items = [(q, None) for q in queries]  # (query, its place name)
    (version, first), (_, rest) = loader.run_batch(loaded, [Submission("resolve", params, items[:1]),
                                                            Submission("resolve", params, items[1:])])
    assert len(calls) == 1 and sorted(calls[0]) == sorted(model_text(q) for q in queries)
    (matches, answer), = first
    assert matches == plain[0]  # what the cache keeps: no reviewer's decision in it
    assert answer[0]["id"] == chosen["id"] and answer[0]["source"] == "confirmed"
    assert [m for m, _ in rest] == plain[1:] and [a for _, a in rest] == plain[1:]


def test_a_confirmed_answer_is_served_at_once_even_from_the_cache(own_index):
    """A reviewer's label lands in the store while the service runs: the next request (a cache hit) has the
    confirmed entry first; a cached answer is not changed by it."""
    from mgeo_index import settings, store
    from mgeo_index.text import model_text

    query = "南京鼓楼胜利路48号东方大厦"
    with TestClient(create_app(ServeConfig(index_dir=own_index, cache_size=100))) as c:
        wait_ready(c)
        before = c.post("/v1/resolve", json={"query": query, "top_k": 5}).json()["matches"]
        chosen = before[2]
        engine = store.connect(settings.database_url(own_index))
        store.add_labels(engine, [{"query": query, "query_normalized": model_text(query), "entry_id": chosen["id"],
                                   "entry_address": chosen["address"], "label": "exact_match"}], reviewer="ana")
        hits = metric(c, "mgeo_cache_hits_total")
        after = c.post("/v1/resolve", json={"query": query, "top_k": 5}).json()["matches"]
        assert metric(c, "mgeo_cache_hits_total") == hits + 1
        assert after[0]["id"] == chosen["id"] and after[0]["source"] == "confirmed" and after[0]["probability"] == 1.0
        assert [m["id"] for m in after[1:]] == [m["id"] for m in before if m["id"] != chosen["id"]][:4]
        assert "source" not in c.post("/v1/resolve", json={"query": "北京海淀东风路127号东方大厦"}).json()["matches"][0]


def test_the_server_loads_and_confirms_aside_with_one_torch_thread_and_leaves_the_count_as_it_was(own_index, monkeypatch):
    """The server loads an index, and puts reviewers' decisions on cached answers, on a side thread: with torch's own
    thread count there, that thread kept an OpenMP pool of its own, and every small batch of the batch thread ran
    about 4x slower (libgomp, managing more threads than cores, puts idle pools to sleep). Side work runs on one
    torch thread and leaves the count as it found it."""
    import torch

    from mgeo_index.service.lifecycle import aside

    real = loader.open_resolver
    seen = []
    monkeypatch.setattr(loader, "open_resolver", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        loaded = asyncio.run(aside(loader.load, own_index))
        assert seen == [1] and torch.get_num_threads() == 2
        assert asyncio.run(aside(torch.get_num_threads)) == 1
        with ThreadPoolExecutor(1) as fresh:  # a thread that first computes now takes up the count as it was
            assert fresh.submit(torch.get_num_threads).result() == 2
        assert loaded.resolver.resolve(["南京鼓楼胜利路48号东方大厦"], top_k=3)[0]
    finally:
        torch.set_num_threads(before)
