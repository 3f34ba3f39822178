"""Reviewers' decisions as data: the review queue in the store, decisions with optimistic
concurrency and undo, labels files in and out, and confirmed answers served by resolve / normalize /
the service."""
import csv
import threading

import pytest
from typer.testing import CliRunner

from mgeo_index import AddressIndex, settings, store
from mgeo_index.cli import app
from mgeo_index.text import model_text

QUERY = "南京鼓楼胜利路48号东方大厦"


def _engine(index_dir):
    return store.connect(settings.database_url(index_dir))


def _item(row: int, query: str, candidates: list[dict], margin: float, disagreement: float = 0.0) -> dict:
    return {"row": row, "query": query, "query_normalized": model_text(query), "candidates": candidates,
            "model_version": "m1", "margin": margin, "disagreement": disagreement}


def _candidates(idx: AddressIndex, query: str, k: int = 3) -> list[dict]:
    return [m.to_dict() for m in idx.resolve(query, top_k=k)]


@pytest.fixture
def index_with_queue(sample_index_copy):
    with AddressIndex.open(sample_index_copy, device="cpu") as idx:
        engine = _engine(sample_index_copy)
        queries = [QUERY, "深圳南山中山路75号东方科技园", "北京海淀东风路127号东方大厦"]
        items = [_item(i, q, _candidates(idx, q), margin) for i, (q, margin) in enumerate(zip(queries, (0.5, 0.1, 0.3)))]
        assert store.add_review_items(engine, "file:test", items) == 3
        assert store.add_review_items(engine, "file:test", items) == 0  # idempotent
        yield sample_index_copy, idx, engine


def test_queue_orders_by_margin_then_disagreement(index_with_queue):
    _, _, engine = index_with_queue
    assert [i["row"] for i in store.next_review_items(engine, "file:test", 3)] == [1, 2, 0]
    store.add_review_items(engine, "file:test", [_item(7, "另一个地址1号", [], 0.1, disagreement=0.9)])
    assert [i["row"] for i in store.next_review_items(engine, "file:test", 2)] == [7, 1]
    assert store.next_review_items(engine, "file:other") == []


def test_decisions_write_labels_and_undo_keeps_them(index_with_queue):
    _, _, engine = index_with_queue
    first, second, third = store.next_review_items(engine, "file:test", 3)
    store.decide(engine, first["id"], "exact", candidate=1, reviewer="ana", model_version="m1")
    store.decide(engine, second["id"], "none", reviewer="ana")
    store.decide(engine, third["id"], "skip", reviewer="ana")
    labels = store.list_labels(engine)
    assert [(l["entry_id"], l["label"]) for l in labels[:1]] == [(first["candidates"][1]["id"], "exact_match")]
    assert [l["label"] for l in labels[1:]] == ["not_match"] * len(second["candidates"])
    assert {l["reviewer"] for l in labels} == {"ana"} and all(l["model_version"] == "m1" for l in labels)
    counts = store.review_counts(engine, "file:test")
    assert counts["decided"] == 2 and counts["skipped"] == 1 and counts["pending"] == 0
    assert counts["exact_match"] == 1 and counts["not_match"] == len(second["candidates"])

    undone = store.undo_last(engine, "file:test", "ana")  # the skip: no labels to undo
    assert undone["id"] == third["id"] and undone["status"] == "pending"
    undone = store.undo_last(engine, "file:test", "ana")
    assert undone["id"] == second["id"]
    assert len(store.list_labels(engine)) == 1  # active labels
    everything = store.list_labels(engine, include_undone=True)
    assert len(everything) == 1 + len(second["candidates"]) and sum(l["undone_at"] is not None for l in everything) == len(second["candidates"])
    # an undone item comes back first
    assert store.next_review_items(engine, "file:test", 1)[0]["id"] in (second["id"], third["id"])
    assert store.undo_last(engine, "file:test", "bob") is None


def test_bad_decisions_are_refused_with_a_reason(index_with_queue):
    _, _, engine = index_with_queue
    item = store.next_review_items(engine, "file:test", 1)[0]
    with pytest.raises(store.ReviewError, match="not in any review queue"):
        store.decide(engine, 10_000, "exact", candidate=0, reviewer="ana")
    with pytest.raises(store.ReviewError, match="reload the page"):
        store.decide(engine, item["id"], "exact", candidate=0, reviewer="ana", model_version="m0")
    with pytest.raises(store.ReviewError, match="candidate must be 1"):
        store.decide(engine, item["id"], "exact", candidate=len(item["candidates"]), reviewer="ana")
    with pytest.raises(store.ReviewError, match="decision must be one of"):
        store.decide(engine, item["id"], "maybe", reviewer="ana")
    assert store.list_labels(engine) == []


def test_two_reviewers_at_once_leave_exactly_one_decision(index_with_queue):
    _, _, engine = index_with_queue
    item = store.next_review_items(engine, "file:test", 1)[0]
    barrier, outcomes = threading.Barrier(4), []

    def review(name: str, decision: str) -> None:
        barrier.wait()
        try:
            store.decide(engine, item["id"], decision, candidate=0, reviewer=name, expected_version=item["version"])
            outcomes.append(("ok", name))
        except store.ReviewConflict as exc:
            outcomes.append(("conflict", str(exc)))

    threads = [threading.Thread(target=review, args=(f"r{i}", ("exact", "partial", "none", "exact")[i])) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o[0] == "ok"]
    assert len(winners) == 1, outcomes
    assert all("was decided by " + winners[0][1] in msg for kind, msg in outcomes if kind == "conflict")
    assert len({l["decision"] for l in store.list_labels(engine)}) == 1


def test_confirmed_entry_comes_first_and_rejected_ones_go(index_with_queue):
    index_dir, idx, engine = index_with_queue
    before = idx.resolve(QUERY, top_k=5)
    chosen = before[3]  # a candidate the model did not put first
    item = next(i for i in store.next_review_items(engine, "file:test", 3) if i["query"] == QUERY)
    store.add_review_items(engine, "file:test2", [_item(0, QUERY, [m.to_dict() for m in before], 0.0)])
    item = store.next_review_items(engine, "file:test2", 1)[0]
    store.decide(engine, item["id"], "exact", candidate=3, reviewer="ana")
    after = idx.resolve(QUERY, top_k=5)
    assert after[0].id == chosen.id and after[0].source == "confirmed"
    assert after[0].label == "exact_match" and after[0].probability == 1.0
    assert [m.source for m in after[1:]] == [None] * 4
    assert len(after) == 5 and len({m.id for m in after}) == 5
    # same through the CLI's JSON and a batch with other queries
    batch = idx.resolve(["北京海淀东风路127号东方大厦", QUERY], top_k=2)
    assert batch[1][0].id == chosen.id and batch[0][0].source is None

    # a "none" on the next query's candidates removes them from its answers
    other = "北京海淀东风路127号东方大厦"
    shown = [m.to_dict() for m in idx.resolve(other, top_k=2)]
    store.add_review_items(engine, "file:test2", [_item(1, other, shown, 0.0)])
    store.decide(engine, store.next_review_items(engine, "file:test2", 1)[0]["id"], "none", reviewer="ana")
    assert not {m["id"] for m in shown} & {m.id for m in idx.resolve(other, top_k=5)}

    # removing the confirmed entry from the catalog retires the confirmation
    idx.remove([chosen.source_id])
    again = idx.resolve(QUERY, top_k=5)
    assert chosen.id not in {m.id for m in again} and all(m.source is None for m in again)


def test_confirmed_entry_missing_from_retrieval_is_fetched_with_explanation(index_with_queue):
    _, idx, engine = index_with_queue
    far = idx.resolve("深圳南山中山路75号东方科技园", top_k=1)[0]  # an entry unrelated to QUERY
    assert far.id not in {m.id for m in idx.resolve(QUERY, top_k=10)}
    store.add_labels(engine, [{"query": QUERY, "query_normalized": model_text(QUERY), "entry_id": far.id,
                               "entry_address": far.address, "label": "exact_match"}], reviewer="ana")
    top = idx.resolve(QUERY, top_k=3, explain=True)
    assert top[0].id == far.id and top[0].source == "confirmed" and top[0].explain
    assert top[0].score is not None and len(top) == 3
    plain = idx.resolve(QUERY, top_k=3, rerank=False)
    assert plain[0].id == far.id and plain[0].label is None and plain[0].source == "confirmed"


def test_normalize_frame_serves_confirmed_answers(index_with_queue):
    pd = pytest.importorskip("pandas")
    _, idx, engine = index_with_queue
    chosen = idx.resolve(QUERY, top_k=5)[4]
    store.add_labels(engine, [{"query": QUERY, "query_normalized": model_text(QUERY), "entry_id": chosen.id,
                               "entry_address": chosen.address, "label": "exact_match"}], reviewer="ana")
    out = idx.normalize(pd.DataFrame({"addr": [QUERY, QUERY + " "]}), address_column="addr")
    assert list(out["match_id"]) == [chosen.source_id, chosen.source_id]
    assert list(out["status"]) == ["matched", "matched"]


def test_labels_export_and_import_round_trip_through_the_cli(index_with_queue, tmp_path):
    index_dir, idx, engine = index_with_queue
    item = store.next_review_items(engine, "file:test", 1)[0]
    store.decide(engine, item["id"], "partial", candidate=0, reviewer="ana")
    out = tmp_path / "labels.tsv"
    runner = CliRunner()
    result = runner.invoke(app, ["labels", "export", "--index-dir", str(index_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open(encoding="utf-8"), delimiter="\t"))
    assert [(r["a"], r["b"], r["label"], r["reviewer"]) for r in rows] == [
        (item["query"], item["candidates"][0]["address"], "partial_match", "ana")]
    # eval pairs reads it as it is
    from mgeo_index.measure.evaluate import read_labeled_pairs

    assert read_labeled_pairs(out) == ([item["query"]], [item["candidates"][0]["address"]], [1])
    # and train --pairs reads it as training pairs, the query its group
    from mgeo_index.training.data import labelled_file_pairs

    (pair,) = labelled_file_pairs(out)
    assert (pair.a, pair.b, pair.label, pair.source) == (item["query"], item["candidates"][0]["address"], "partial_match",
                                                         "labels:labels.tsv")
    assert pair.group == model_text(item["query"])
    (tmp_path / "pairs").mkdir()
    result = runner.invoke(app, ["train", "--data", str(tmp_path), "--pairs", str(tmp_path / "missing.tsv")])
    flat = "".join(result.output.replace("│", "").split())  # the message as rich wraps it in its box
    assert result.exit_code == 2 and "missing.tsvdoesnotexist" in flat

    # import: an exact_match on a catalog address becomes a confirmed answer
    entry = idx.resolve("北京海淀东风路127号东方大厦", top_k=1)[0]
    team = tmp_path / "team.tsv"
    team.write_text(f"a\tb\tlabel\n{QUERY}\t{entry.address}\texact_match\n某地某路1号\t不在目录里的地址\tnot_match\n",
                    encoding="utf-8")
    result = runner.invoke(app, ["labels", "import", str(team), "--index-dir", str(index_dir), "--reviewer", "ops"])
    assert result.exit_code == 0, result.output
    assert "imported 2 labels" in result.output and "1 linked" in result.output
    assert idx.resolve(QUERY, top_k=1)[0].id == entry.id

    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\tlabel\nx\ty\tmaybe\n", encoding="utf-8")
    result = runner.invoke(app, ["labels", "import", str(bad), "--index-dir", str(index_dir)])
    assert result.exit_code == 1 and "line 2" in result.output and "maybe" in result.output


def test_random_order_is_fixed_and_still_puts_an_undone_item_first(index_with_queue):
    _, _, engine = index_with_queue
    store.add_review_items(engine, "file:test", [_item(r, f"地址{r}号", [], 0.5) for r in range(10, 40)])
    first = [i["row"] for i in store.next_review_items(engine, "file:test", 33, order="random")]
    assert first == [i["row"] for i in store.next_review_items(engine, "file:test", 33, order="random")]
    assert sorted(first) == sorted(i["row"] for i in store.next_review_items(engine, "file:test", 33))
    assert first != sorted(first) and first[:3] != [1, 2, 0]  # not the uncertainty order
    decided = store.next_review_items(engine, "file:test", 1, order="random")[0]
    store.decide(engine, decided["id"], "skip", reviewer="ana")
    store.undo_last(engine, "file:test", "ana")
    assert store.next_review_items(engine, "file:test", 1, order="random")[0]["id"] == decided["id"]
    with pytest.raises(store.ReviewError, match="order must be one of"):
        store.next_review_items(engine, "file:test", order="newest")


def test_the_review_queue_on_postgresql(pg_url):
    """Decisions, the conflict, undo and both orders on the production database."""
    engine = store.connect(pg_url)
    candidates = [{"id": None, "address": f"候选{i}号", "probabilities": {"exact_match": 0.4}} for i in range(3)]
    items = [_item(r, f"地址{r}号", candidates, margin=r / 100) for r in range(12)]
    assert store.add_review_items(engine, "file:pg", items) == 12
    assert [i["row"] for i in store.next_review_items(engine, "file:pg", 3)] == [0, 1, 2]
    shuffled = [i["row"] for i in store.next_review_items(engine, "file:pg", 12, order="random")]
    assert sorted(shuffled) == list(range(12)) and shuffled != list(range(12))
    first = store.next_review_items(engine, "file:pg", 1)[0]
    store.decide(engine, first["id"], "none", reviewer="ana", expected_version=first["version"])
    with pytest.raises(store.ReviewConflict, match="decided by ana"):
        store.decide(engine, first["id"], "exact", candidate=0, reviewer="bob", expected_version=first["version"])
    assert [l["label"] for l in store.list_labels(engine)] == ["not_match"] * 3
    assert store.undo_last(engine, "file:pg", "ana")["id"] == first["id"]
    assert store.list_labels(engine) == [] and store.review_counts(engine, "file:pg")["pending"] == 12
    engine.dispose()


def test_every_confirmed_answer_is_served_first_and_none_after_its_removal(sample_index_copy):
    """The issue's target: confirmed answers 100% at rank 1 after confirmation, none after the entry's removal
    (20 queries, each confirmed on a candidate the model ranked 2nd to 10th)."""
    import random

    with AddressIndex.open(sample_index_copy, device="cpu") as idx:
        engine = _engine(sample_index_copy)
        with settings.SAMPLE_CATALOG.open(encoding="utf-8") as fh:  # catalog addresses without their province
            queries = [row["address"][3:] for row, _ in zip(csv.DictReader(fh), range(20))]
        rng = random.Random(0)
        before = idx.resolve(queries, top_k=10)
        chosen = [rng.choice(matches[1:]) for matches in before]
        store.add_labels(engine, [{"query": q, "query_normalized": model_text(q), "entry_id": c.id, "entry_address": c.address,
                                   "label": "exact_match"} for q, c in zip(queries, chosen)], reviewer="ana")
        after = idx.resolve(queries, top_k=10)
        assert [m[0].id for m in after] == [c.id for c in chosen]
        assert all(m[0].source == "confirmed" for m in after)
        idx.remove(sorted({c.source_id for c in chosen}))
        gone = {c.id for c in chosen}
        assert not any(m.id in gone or m.source for matches in idx.resolve(queries, top_k=10) for m in matches)
