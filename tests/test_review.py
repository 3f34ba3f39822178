"""The review queue and page (`mgeo-index review`): queue building and order, decisions as labels, undo,
two reviewers at once, refusals (unknown item, stale model), escaping, API keys, and the CLI without
serving. The page is driven through FastAPI's TestClient; the real-browser test is test_review_browser.py."""
import csv
import re

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")

from fastapi.testclient import TestClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from mgeo_index import AddressIndex, store  # noqa: E402
from mgeo_index.cli import app as cli_app  # noqa: E402
from mgeo_index.review import queue as review_queue  # noqa: E402
from mgeo_index.review.app import SESSION_COOKIE, ReviewState, create_app, parse_api_keys  # noqa: E402
from mgeo_index.review.uncertainty import margin  # noqa: E402
from mgeo_index.settings import LABELS  # noqa: E402
from conftest import copy_index  # noqa: E402

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
QUERIES = [
    "深圳南山中山路75号东方科技园9号楼",
    "北京海淀燕园街道东风路127号东方大厦",
    "南京鼓楼下关街道中山路89号星河广场",
    "北京朝阳建国路88号",
    "上海徐汇漕溪北路1号",
    SCRIPT,
    IMG,
    "深圳南山中山路75号东方科技园9号楼",  # a repeat: one item only
]
JSON = {"Accept": "application/json"}


@pytest.fixture(scope="module")
def review_env(sample_index, tmp_path_factory):
    """(index directory copy, open AddressIndex, queries file, QueueInfo): one scored file queue per module."""
    root = tmp_path_factory.mktemp("review")
    index_dir = copy_index(sample_index, root / "idx")
    queries = root / "queries.txt"
    queries.write_text("\n".join(QUERIES) + "\n\n", encoding="utf-8")
    index = AddressIndex.open(index_dir, device="cpu")
    info = review_queue.open_queue(index, file=queries)
    yield index_dir, index, queries, info
    index.close()


@pytest.fixture
def queue(review_env, request):
    """A private queue for one test: the module queue's items copied under a new name (no model run)."""
    _, index, _, info = review_env
    engine = index.resolver.engine
    name = f"test:{request.node.name}"[:64]
    items = store.next_review_items(engine, info.name, limit=100)
    store.add_review_items(engine, name, items)
    return name


def client_for(index, queue, **state):
    review = ReviewState(engine=index.resolver.engine, queue=queue, model_version=review_queue.model_version(index),
                         **{"local_user": "tester", **state})
    return TestClient(create_app(review))


def form(item, decision, candidate=None, **over):
    data = {"item_id": item["id"], "version": item["version"], "model_version": item["model_version"], "decision": decision}
    if candidate is not None:
        data["candidate"] = candidate
    return {**data, **over}


def labels_of(engine, item_id, include_undone=False):
    return [row for row in store.list_labels(engine, include_undone=include_undone) if row["item_id"] == item_id]


# --------------------------------------------------------------------------- the queue


def test_queue_name_for_job_and_file(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("北京朝阳建国路88号\n", encoding="utf-8")
    b.write_text("北京朝阳建国路88号\n", encoding="utf-8")
    assert review_queue.queue_name(job=7) == "job:7"
    assert re.fullmatch(r"file:[0-9a-f]{12}", review_queue.queue_name(file=a))
    assert review_queue.queue_name(file=a) == review_queue.queue_name(file=b)  # by contents, not path
    b.write_text("上海徐汇漕溪北路1号\n", encoding="utf-8")
    assert review_queue.queue_name(file=a) != review_queue.queue_name(file=b)
    with pytest.raises(ValueError):
        review_queue.queue_name()


def test_queue_items_are_scored_and_deduplicated(review_env):
    _, index, queries, info = review_env
    assert info.added == len(set(QUERIES)) and info.counts["pending"] == len(set(QUERIES))
    assert info.model_version == index.cross_encoder.fingerprint
    items = store.next_review_items(index.resolver.engine, info.name, limit=100)
    assert sorted(i["query"] for i in items) == sorted(set(QUERIES))
    for item in items:
        assert 1 <= len(item["candidates"]) <= review_queue.CANDIDATES_SHOWN
        assert all("explain" in c and "probabilities" in c for c in item["candidates"])
        probs = [[c["probabilities"][label] for label in LABELS] for c in item["candidates"]]
        assert item["margin"] == pytest.approx(margin(probs))
        assert 0.0 <= item["disagreement"] <= 1.0
    # opening the same file again adds nothing and re-scores nothing
    again = review_queue.open_queue(index, file=queries)
    assert (again.added, again.rescored, again.counts["total"]) == (0, 0, info.counts["total"])


def test_queue_order_smallest_margin_first(review_env):
    _, index, _, info = review_env
    engine = index.resolver.engine
    margins = [i["margin"] for i in store.next_review_items(engine, info.name, limit=100)]
    assert margins == sorted(margins)
    template = store.next_review_items(engine, info.name, limit=1)[0]
    store.add_review_items(engine, "test:order", [
        {**template, "row": row, "margin": m, "disagreement": d}
        for row, m, d in [(1, 0.5, 0.9), (2, 0.1, 0.0), (3, 0.3, 0.2), (4, 0.1, 0.4)]])
    ordered = [i["row"] for i in store.next_review_items(engine, "test:order", limit=10)]
    assert ordered == [4, 2, 3, 1]  # margin, then the larger disagreement first


def test_pending_items_of_another_model_are_rescored(review_env, queue):
    _, index, _, _ = review_env
    engine = index.resolver.engine
    from sqlalchemy import update

    from mgeo_index.store.reviews import ReviewItem

    with engine.begin() as conn:
        conn.execute(update(ReviewItem).where(ReviewItem.queue == queue).values(model_version="an-older-model"))
    first = store.next_review_items(engine, queue, limit=1)[0]
    client = client_for(index, queue)
    assert client.post("/decide", data=form(first, "skip"), headers=JSON).status_code == 409  # stale: refused
    assert review_queue.rescore_stale(index, queue) == len(set(QUERIES))
    fresh = store.get_review_item(engine, first["id"])
    assert fresh["model_version"] == index.cross_encoder.fingerprint and fresh["version"] == first["version"] + 1
    assert client.post("/decide", data=form(fresh, "skip"), headers=JSON).status_code == 200


def test_job_queue_takes_uncertain_rows(review_env, tmp_path):
    index_dir, index, _, _ = review_env
    from mgeo_index.jobs import normalize_file

    rows = [("r1", "广东省深圳市南山区南山街道中山路75号东方科技园9号楼"), ("r2", "北京朝阳建国路88号"),
            ("r3", "上海徐汇漕溪北路1号"), ("r4", "北京朝阳建国路88号")]
    source = tmp_path / "stores.csv"
    with open(source, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([("id", "address"), *rows])
    result = normalize_file(source, tmp_path / "out.csv", index_dir, address_column="address", id_column="id", device="cpu")
    with open(tmp_path / "out.csv", encoding="utf-8", newline="") as fh:
        written = list(csv.DictReader(fh))
    expected = {(n, r["address"], None) for n, r in enumerate(written, 1)
                if r["status"] in ("ambiguous", "unmatched") or (r["status"] == "matched" and float(r["probability"]) < 0.9)}
    assert review_queue.job_queries(index.resolver.engine, result.job_id) == sorted(expected)
    assert expected, "the sample should leave at least one row to review"
    info = review_queue.open_queue(index, job=result.job_id)
    assert info.name == f"job:{result.job_id}"
    assert info.added == len({a for _, a, _ in expected})  # r2 and r4 are one address: one item
    with pytest.raises(ValueError, match="no normalize job"):
        review_queue.job_queries(index.resolver.engine, 9999)


# --------------------------------------------------------------------------- decisions


def test_decisions_become_labels(review_env, queue):
    _, index, _, _ = review_env
    engine = index.resolver.engine
    client = client_for(index, queue)
    page = client.get("/", headers=JSON).json()
    exact = page["item"]
    assert page["reviewer"] == "tester" and page["counts"]["pending"] == len(set(QUERIES))
    answer = client.post("/decide", data=form(exact, "exact", 2), follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    [row] = labels_of(engine, exact["id"])
    assert (row["entry_id"], row["label"], row["decision"], row["reviewer"], row["query"]) == (
        exact["candidates"][1]["id"], "exact_match", "exact", "tester", exact["query"])
    assert row["model_version"] == exact["model_version"]
    assert row["probability"] == pytest.approx(exact["candidates"][1]["probabilities"]["exact_match"])

    none = client.get("/", headers=JSON).json()["item"]
    assert none["id"] != exact["id"]
    assert client.post("/decide", data=form(none, "none"), headers=JSON).json()["status"] == "decided"
    rows = labels_of(engine, none["id"])
    assert sorted(r["entry_id"] for r in rows) == sorted(c["id"] for c in none["candidates"])
    assert {r["label"] for r in rows} == {"not_match"}

    partial = client.get("/", headers=JSON).json()["item"]
    client.post("/decide", data=form(partial, "partial", 1))
    assert [(r["entry_id"], r["label"]) for r in labels_of(engine, partial["id"])] == [
        (partial["candidates"][0]["id"], "partial_match")]

    skipped = client.get("/", headers=JSON).json()["item"]
    assert client.post("/decide", data=form(skipped, "skip"), headers=JSON).json()["status"] == "skipped"
    assert labels_of(engine, skipped["id"]) == []

    counts = client.get("/", headers=JSON).json()["counts"]
    assert (counts["decided"], counts["skipped"], counts["exact_match"], counts["partial_match"]) == (3, 1, 1, 1)
    assert counts["not_match"] == len(none["candidates"])
    bad = client.post("/decide", data=form(client.get("/", headers=JSON).json()["item"], "exact", 9), headers=JSON)
    assert bad.status_code == 422 and "candidate" in bad.json()["detail"]


def test_undo_marks_labels_and_returns_the_item(review_env, queue):
    _, index, _, _ = review_env
    engine = index.resolver.engine
    client = client_for(index, queue)
    first = client.get("/", headers=JSON).json()["item"]
    client.post("/decide", data=form(first, "none"))
    assert client.get("/", headers=JSON).json()["item"]["id"] != first["id"]
    page = client.post("/undo")  # a browser: redirected to the page, with a message
    assert page.status_code == 200 and "undone" in page.text
    assert client.get("/", headers=JSON).json()["item"]["id"] == first["id"]  # shown again, first
    rows = labels_of(engine, first["id"], include_undone=True)
    assert rows and all(r["undone_at"] is not None for r in rows)
    assert labels_of(engine, first["id"]) == []
    assert store.get_review_item(engine, first["id"])["status"] == "pending"
    nothing = client_for(index, queue, local_user="someone-else").post("/undo", headers=JSON)
    assert nothing.status_code == 409 and "someone-else" in nothing.json()["detail"]


def test_two_reviewers_one_decision(review_env, queue):
    _, index, _, _ = review_env
    engine = index.resolver.engine
    review = ReviewState(engine=engine, queue=queue, model_version=review_queue.model_version(index),
                         keys=parse_api_keys(["alice:ka", "bob:kb"]))
    client = TestClient(create_app(review))
    alice, bob = {**JSON, "X-API-Key": "ka"}, {**JSON, "Authorization": "Bearer kb"}
    shown_alice = client.get("/", headers=alice).json()["item"]
    shown_bob = client.get("/", headers=bob).json()["item"]
    assert shown_alice["id"] != shown_bob["id"]  # an item open on one page is not offered to another
    assert client.post("/decide", data=form(shown_alice, "exact", 1), headers=alice).status_code == 200
    late = client.post("/decide", data=form(shown_alice, "none"), headers=bob)  # bob had the same page open
    assert late.status_code == 409 and "alice" in late.json()["detail"]
    assert [(r["reviewer"], r["label"]) for r in labels_of(engine, shown_alice["id"])] == [("alice", "exact_match")]
    # a browser gets the page back with the message
    page = client.post("/decide", data=form(shown_alice, "skip"), headers={"X-API-Key": "kb"})
    assert page.status_code == 200 and "decided by alice" in page.text


def test_refused_decisions(review_env, queue):
    _, index, _, info = review_env
    engine = index.resolver.engine
    client = client_for(index, queue)
    item = client.get("/", headers=JSON).json()["item"]
    unknown = client.post("/decide", data=form(item, "skip", item_id=987654), headers=JSON)
    assert unknown.status_code == 404 and "not in this review queue" in unknown.json()["detail"]
    other = store.next_review_items(engine, info.name, limit=1)[0]  # an item of another queue
    assert client.post("/decide", data=form(other, "skip"), headers=JSON).status_code == 404
    stale = client.post("/decide", data=form(item, "exact", 1, model_version="0123456789abcdef"), headers=JSON)
    assert stale.status_code == 409 and "not recorded" in stale.json()["detail"]
    assert client.post("/decide", data=form(item, "maybe"), headers=JSON).status_code == 422
    assert store.get_review_item(engine, item["id"])["status"] == "pending" and labels_of(engine, item["id"]) == []
    page = client.post("/decide", data=form(item, "skip", item_id=987654))
    assert page.status_code == 200 and "not in this review queue" in page.text


def test_stale_when_the_active_model_changes(sample_index, tmp_path):
    index_dir = copy_index(sample_index, tmp_path / "idx")
    from mgeo_index import settings

    engine = store.connect(settings.database_url(index_dir))
    template = {"row": 1, "query": "北京朝阳建国路88号", "query_normalized": "北京朝阳建国路88号", "model_version": "m-shipped",
                "margin": 0.1, "disagreement": 0.0,
                "candidates": [{"id": 1, "address": "广东省深圳市南山区南山街道中山路75号东方科技园9号楼",
                                "probabilities": {"exact_match": 0.4, "partial_match": 0.3, "not_match": 0.3}}]}
    store.add_review_items(engine, "q", [template])
    client = TestClient(create_app(ReviewState(engine=engine, queue="q", model_version="m-shipped", local_user="t")))
    item = client.get("/", headers=JSON).json()["item"]
    store.add_model_version(engine, kind="cross", path="models/cross-1", fingerprint="m-adapted")
    refused = client.post("/decide", data=form(item, "exact", 1), headers=JSON)
    assert refused.status_code == 409 and "m-adapted" in refused.json()["detail"] and "restart" in refused.json()["detail"]
    assert store.get_review_item(engine, item["id"])["status"] == "pending"


# --------------------------------------------------------------------------- security


def test_every_text_is_escaped(review_env, queue):
    _, index, _, _ = review_env
    engine = index.resolver.engine
    base = store.next_review_items(engine, queue, limit=1)[0]
    hostile = [{**c, "address": IMG + c["address"], "source_id": SCRIPT} for c in base["candidates"]]
    store.add_review_items(engine, "test:escape", [{**base, "row": 1, "query": SCRIPT, "candidates": hostile, "margin": 0.0}])
    client = client_for(index, "test:escape")
    html = client.get("/").text
    assert "<script>alert" not in html and "<img src=x" not in html and 'onerror=alert(1)>' not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/review.js" defer>']  # only our own script
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    # an item whose query is hostile: after a decision, the flash message echoes it escaped too
    item = client.get("/", headers=JSON).json()["item"]
    client.post("/decide", data=form(item, "skip"))
    page = client.post("/undo")
    assert "&lt;script&gt;" in page.text and "<script>alert" not in page.text


def test_api_key_login_cookie_and_headers(review_env, queue):
    _, index, _, _ = review_env
    engine = index.resolver.engine
    review = ReviewState(engine=engine, queue=queue, model_version=review_queue.model_version(index),
                         keys=parse_api_keys(["alice:s3cret-a", "bare-key"]))
    client = TestClient(create_app(review))
    assert client.get("/", follow_redirects=False).headers["location"] == "/login"
    assert client.get("/", headers=JSON).status_code == 401
    assert client.get("/", headers={**JSON, "X-API-Key": "nope"}).status_code == 401
    assert "Sign in" in client.get("/login").text
    wrong = client.post("/login", data={"key": "nope"})
    assert wrong.status_code == 401 and "wrong key" in wrong.text
    login = client.post("/login", data={"key": "s3cret-a"}, follow_redirects=False)
    assert login.status_code == 303
    cookie = login.headers["set-cookie"]
    assert SESSION_COOKIE in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "s3cret-a" not in cookie  # the cookie holds a keyed hash, not the key
    page = client.get("/")
    assert page.status_code == 200 and "alice" in page.text
    item = client.get("/", headers=JSON).json()["item"]
    client.post("/decide", data=form(item, "exact", 1))
    assert [r["reviewer"] for r in labels_of(engine, item["id"])] == ["alice"]
    client.post("/logout")
    assert client.get("/", headers=JSON).status_code == 401
    client.cookies.set(SESSION_COOKIE, "alice.forged")
    assert client.get("/", headers=JSON).status_code == 401
    client.cookies.clear()
    bare = client.get("/", headers={**JSON, "Authorization": "Bearer bare-key"}).json()
    assert bare["reviewer"] == "reviewer"


def test_parse_api_keys():
    assert parse_api_keys(["alice:k1", "k2", "bob:k:3"]) == {"k1": "alice", "k2": "reviewer", "k:3": "bob"}
    assert parse_api_keys(None) == {}
    for bad in (["alice:"], [":k"], ["a:k", "b:k"]):
        with pytest.raises(ValueError):
            parse_api_keys(bad)


def test_cross_origin_posts_and_foreign_hosts_are_refused(review_env, queue):
    _, index, _, _ = review_env
    engine = index.resolver.engine
    review = ReviewState(engine=engine, queue=queue, model_version=review_queue.model_version(index), local_user="t")
    client = TestClient(create_app(review, allowed_hosts=("127.0.0.1", "localhost")), base_url="http://127.0.0.1:8100")
    item = client.get("/", headers=JSON).json()["item"]
    evil = client.post("/decide", data=form(item, "exact", 1), headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403
    assert client.post("/decide", data=form(item, "skip"), headers={"Origin": "null"}).status_code == 403
    assert store.get_review_item(engine, item["id"])["status"] == "pending"
    ok = client.post("/decide", data=form(item, "skip"), headers={**JSON, "Origin": "http://127.0.0.1:8100"})
    assert ok.status_code == 200
    assert client.get("/", headers={"Host": "rebound.example"}).status_code == 400


def test_static_assets_are_local(review_env, queue):
    _, index, _, _ = review_env
    client = client_for(index, queue)
    html = client.get("/").text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing from the internet
    for asset in ("/static/review.js", "/static/review.css"):
        assert client.get(asset).status_code == 200
    assert "requestSubmit" in client.get("/static/review.js").text


# --------------------------------------------------------------------------- CLI


def test_cli_builds_a_file_queue_without_serving(sample_index, tmp_path):
    index_dir = copy_index(sample_index, tmp_path / "idx")
    queries = tmp_path / "q.txt"
    queries.write_text("北京朝阳建国路88号\n\n上海徐汇漕溪北路1号\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(cli_app, ["review", "--index-dir", str(index_dir), "--file", str(queries), "--no-serve",
                                     "--device", "cpu", "--top-k", "3"])
    assert result.exit_code == 0, result.output
    name = review_queue.queue_name(file=queries)
    assert name in result.output and "2 items (2 new, 0 re-scored)" in result.output
    from mgeo_index import settings

    engine = store.connect(settings.database_url(index_dir))
    items = store.next_review_items(engine, name, limit=10)
    assert len(items) == 2 and all(len(i["candidates"]) == 3 for i in items)
    assert runner.invoke(cli_app, ["review", "--index-dir", str(index_dir), "--no-serve"]).exit_code != 0
    missing = runner.invoke(cli_app, ["review", "--index-dir", str(index_dir), "--file", str(tmp_path / "none.txt"),
                                      "--no-serve", "--device", "cpu"])
    assert missing.exit_code == 1 and "does not exist" in missing.output
    assert runner.invoke(cli_app, ["review", "--help"]).output.count("Example:") == 1


def test_a_name_column_jobs_queue_resolves_shows_and_labels_each_row_with_its_name(review_env, tmp_path):
    """A job kept as name + address (normalize --name-column): its review items are resolved with the row's name, as
    the job resolved them; the page shows the name; a decision labels the text the scorer read (address + name),
    which is what confirmations are found by."""
    from mgeo_index.jobs import normalize_file
    from mgeo_index.text import model_text, with_name

    _, index, _, _ = review_env
    engine = index.resolver.engine
    rows = [("s1", "深圳南山中山路75号", "东方科技园"), ("s2", "北京海淀东风路127号", "东方大厦"),
            ("s3", "北京海淀东风路127号", "")]
    source = tmp_path / "shops.csv"
    with open(source, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([("id", "shop", "address"), *[(i, n, a) for i, a, n in rows]])
    result = normalize_file(source, tmp_path / "shops.out.csv", review_env[0], address_column="address",
                            id_column="id", name_column="shop", device="cpu")
    wanted = review_queue.job_queries(engine, result.job_id, below=1.01)  # every row
    assert wanted == [(1, rows[0][1], "东方科技园"), (2, rows[1][1], "东方大厦"), (3, rows[2][1], None)]
    info = review_queue.open_queue(index, job=result.job_id, below=1.01)
    assert info.added == 3  # s2 and s3: one address, two places
    items = {i["row"]: i for i in store.next_review_items(engine, info.name, limit=10)}
    for row, (_, address, name) in enumerate(rows, 1):
        item = items[row]
        assert item["name"] == (name or None) and item["query"] == address
        assert item["query_normalized"] == model_text(with_name(address, name or None))
        resolved = index.resolve(address, top_k=review_queue.CANDIDATES_SHOWN, names=[name or None])
        assert [c["id"] for c in item["candidates"]] == [m.id for m in resolved]
    named = items[1]
    only = "test:named"  # a queue holding the named item alone, so that the page shows it
    store.add_review_items(engine, only, [named])
    client = client_for(index, only)
    shown = client.get("/", headers=JSON).json()["item"]
    assert shown["name"] == "东方科技园" and shown["query"] == rows[0][1]
    page = client.get("/").text
    assert "Input place" in page and "东方科技园" in page
    assert client.post("/decide", data=form(shown, "exact", 1), headers=JSON).json()["status"] == "decided"
    [label] = labels_of(engine, shown["id"])
    assert label["query_normalized"] == named["query_normalized"] == model_text(rows[0][1] + "东方科技园")
    assert store.confirmations(engine, [label["query_normalized"]])[label["query_normalized"]]["confirmed"]
