"""`mgeo-index eval`: reading labeled files, pair reports and retrieval reports on the sample catalog."""
import csv
import json

import pytest
from typer.testing import CliRunner

from mgeo_index import settings
from mgeo_index.catalog.reader import CatalogError
from mgeo_index.cli import app
from mgeo_index.measure.evaluate import read_gold_queries, read_labeled_pairs

runner = CliRunner()


def _sample_rows():
    with open(settings.SAMPLE_CATALOG, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_read_labeled_pairs_both_styles(tmp_path):
    ccks = tmp_path / "ccks.tsv"
    ccks.write_text("query_id\tquery\tcandidate\tlabel\nq1\t北京朝阳\t北京市朝阳区\texact_match\nq1\t北京朝阳\t上海\tnot_match\n", encoding="utf-8")
    assert read_labeled_pairs(ccks) == (["北京朝阳", "北京朝阳"], ["北京市朝阳区", "上海"], [0, 2])
    shenzhen = tmp_path / "sz.tsv"
    shenzhen.write_text("addr1\taddr2\tlabel\n甲\t乙\t1\n丙\t丁\t0\n", encoding="utf-8")
    assert read_labeled_pairs(shenzhen)[2] == [0, 2]
    bad = tmp_path / "bad.tsv"
    bad.write_text("addr1\taddr2\tlabel\n甲\t乙\tmaybe\n", encoding="utf-8")
    with pytest.raises(CatalogError, match="line 2: label 'maybe'"):
        read_labeled_pairs(bad)


def test_gold_queries_group_every_exact_match_of_a_query(tmp_path):
    path = tmp_path / "ccks.tsv"
    path.write_text(
        "query_id\tquery\tcandidate\tlabel\n"
        "q1\t北京朝阳建国路88号\t朝阳区建国路88号\texact_match\n"
        "q1\t北京朝阳建国路88号\t建国路88号soho现代城\texact_match\n"
        "q1\t北京朝阳建国路88号\t建国路89号\tpartial_match\n"
        "q2\t南京中山路\t上海中山路\tnot_match\n",
        encoding="utf-8",
    )
    queries, golds = read_gold_queries(path)
    assert queries == ["北京朝阳建国路88号"]  # q2 has no gold entry
    assert golds == [["朝阳区建国路88号", "建国路88号soho现代城"]]


@pytest.fixture(scope="module")
def index_dir(sample_index):
    return sample_index  # evaluation only reads


def test_eval_retrieval_json_finds_verbatim_queries_first(index_dir, tmp_path):
    rows = _sample_rows()[:40]
    path = tmp_path / "gold.tsv"
    # 30 verbatim queries with a gold entry, and 10 whose gold is not in the catalog (left out)
    lines = ["query\tgold"] + [f"{r['address']}\t{r['address']}" for r in rows[:30]]
    lines += [f"{r['address']}\t不在目录里的地址{i}号" for i, r in enumerate(rows[30:])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["eval", "retrieval", str(path), "--index-dir", str(index_dir), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["queries"], report["gold_in_catalog"]) == (40, 30)
    for stage in ("retrieval", "reranked"):
        assert report[stage]["n"] == 30
        assert report[stage]["recall@10"] == 1.0
        assert report[stage]["recall@1"] >= 0.9  # verbatim catalog addresses (duplicates aside)
        assert report[stage]["recall@1"] <= report[stage]["recall@5"] <= report[stage]["recall@10"]


def test_eval_pairs_json_and_reliability_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = _sample_rows()
    lines = ["addr1\taddr2\tlabel"]
    for i, r in enumerate(rows[:60]):
        lines.append(f"{r['address']}\t{r['address']}\t1")
        lines.append(f"{r['address']}\t{rows[(i + 97) % len(rows)]['address']}\t0")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    plot = tmp_path / "rel.png"
    result = runner.invoke(app, ["eval", "pairs", str(path), "--json", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["n"] == 120
    assert report["accuracy"] >= 0.9  # identical vs unrelated addresses: the shipped model must get these
    assert 0 <= report["ece"] <= 1
    assert plot.stat().st_size > 1000


def test_splits_are_disjoint_stable_and_sized_as_documented():
    from collections import Counter

    from mgeo_index.measure.splits import SPLITS, split_of

    groups = [f"q{i}" for i in range(20000)]
    shares = Counter(split_of(g) for g in groups)
    assert set(shares) == set(SPLITS)
    for name, share in (("holdout", 0.07), ("dev", 0.08), ("calib", 0.05), ("train", 0.80)):
        assert abs(shares[name] / len(groups) - share) < 0.01, (name, shares)
    assert [split_of(g) for g in groups[:50]] == [split_of(g) for g in groups[:50]]


def _pairs_in_splits(tmp_path, splits=("dev", "holdout"), per_split=20):
    """A CCKS-style file whose queries fall in ``splits`` (chosen by their query_id's split), plus train rows."""
    from mgeo_index.measure.splits import split_of

    rows = _sample_rows()
    wanted = {name: [] for name in (*splits, "train")}
    i = 0
    while any(len(v) < per_split for v in wanted.values()):
        part = split_of(f"q{i}")
        if part in wanted and len(wanted[part]) < per_split:
            wanted[part].append(f"q{i}")
        i += 1
    lines = ["query_id\tquery\tcandidate\tlabel"]
    for n, qid in enumerate(q for ids in wanted.values() for q in ids):
        address = rows[n]["address"]
        lines.append(f"{qid}\t{address}\t{address}\texact_match")
        lines.append(f"{qid}\t{address}\t{rows[(n + 97) % len(rows)]['address']}\tnot_match")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, wanted


def test_eval_pairs_measures_dev_and_holdout_side_by_side(tmp_path):
    path, wanted = _pairs_in_splits(tmp_path)
    result = runner.invoke(app, ["eval", "pairs", str(path), "--split", "dev,holdout", "--json", "--pairwise"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.output)
    assert list(reports) == ["dev", "holdout"]
    assert all(r["n"] == 2 * len(wanted[name]) for name, r in reports.items())  # train rows left out
    alone = json.loads(runner.invoke(app, ["eval", "pairs", str(path), "--split", "holdout", "--json",
                                           "--pairwise"]).output)
    assert alone == reports["holdout"]  # the same figures as measured alone
    table = runner.invoke(app, ["eval", "pairs", str(path), "--split", "dev,holdout", "--pairwise"],
                          env={"COLUMNS": "120"})
    assert table.exit_code == 0 and "dev (40 pairs)" in table.output and "holdout (40 pairs)" in table.output
    bad = runner.invoke(app, ["eval", "pairs", str(path), "--split", "dev,test"])
    assert bad.exit_code != 0 and "not 'test'" in bad.output


def test_eval_retrieval_reports_each_split(index_dir, tmp_path):
    path, wanted = _pairs_in_splits(tmp_path, per_split=8)
    result = runner.invoke(app, ["eval", "retrieval", str(path), "--split", "dev,holdout", "--index-dir",
                                 str(index_dir), "--json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.output)
    assert list(reports) == ["dev", "holdout"]
    for name, report in reports.items():
        assert report["queries"] == len(wanted[name]) == 8
        assert report["reranked"]["recall@10"] == 1.0  # catalog addresses as their own queries
