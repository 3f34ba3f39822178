"""mgeo_index.catalog.reader: encodings, delimiters, column detection, per-row validation, chunking."""
from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from mgeo_index.catalog.reader import (
    CatalogError,
    Reject,
    Row,
    detect_address_column,
    detect_encoding,
    read_catalog,
    sniff_delimiter,
    write_rejects,
)

ADDRESSES = [
    "北京市朝阳区建国路88号",
    "上海市浦东新区世纪大道100号",
    "广州市天河区天河路385号",
    "深圳市南山区深南大道10000号",
    "杭州市西湖区文三路90号",
]


def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


def _read_all(path: Path, **kwargs) -> tuple[list[Row], list[Reject]]:
    rows: list[Row] = []
    rejects: list[Reject] = []
    for chunk_rows, chunk_rejects in read_catalog(path, **kwargs).chunks():
        rows.extend(chunk_rows)
        rejects.extend(chunk_rejects)
    return rows, rejects


def _csv(addresses: list[str]) -> str:
    return "id,address,city\n" + "".join(f"{i},{a},{a[:2]}\n" for i, a in enumerate(addresses, 1))


# --------------------------------------------------------------------------- encodings


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [("utf-8", "utf-8"), ("utf-8-sig", "utf-8-sig"), ("gb18030", "gb18030"), ("gbk", "gb18030")],
)
def test_encodings_detected_and_read(tmp_path: Path, encoding: str, expected: str) -> None:
    path = _write(tmp_path / "c.csv", _csv(ADDRESSES), encoding)
    assert detect_encoding(path) == expected
    reader = read_catalog(path, id_column="id")
    assert reader.encoding == expected
    assert reader.columns == ["id", "address", "city"]  # no BOM left in the first name
    rows, rejects = _read_all(path, id_column="id")
    assert rejects == []
    assert [r.address for r in rows] == ADDRESSES
    assert rows[0] == Row(line=2, address=ADDRESSES[0], source_id="1", extra={"city": "北京"})


def test_detect_encoding_sample_cut_mid_character(tmp_path: Path) -> None:
    # Over 1 MB of UTF-8 Chinese: the detection sample ends inside a 3-byte character.
    text = "address\n" + "北京市朝阳区建国路88号\n" * 40_000
    path = _write(tmp_path / "big.csv", text)
    assert path.stat().st_size > 1 << 20
    assert detect_encoding(path) == "utf-8"


def test_undecodable_row_in_utf8_file(tmp_path: Path) -> None:
    head = "address\n" + "".join(f"{a}\n" for a in ADDRESSES[:2])
    tail = "".join(f"{a}\n" for a in ADDRESSES[2:])
    path = tmp_path / "mixed.csv"
    # Line 4 was saved from a GBK editor: its bytes are not valid UTF-8.
    path.write_bytes(head.encode("utf-8") + "成都市武侯区".encode("gbk") + b"\n" + tail.encode("utf-8"))
    assert detect_encoding(path) == "utf-8"  # a few bad bytes do not make it GB18030
    rows, rejects = _read_all(path)
    assert [r.address for r in rows] == ADDRESSES
    (reject,) = rejects
    assert reject.reason == "undecodable bytes in row; re-save the file as UTF-8"
    assert reject.line == 4
    assert "\\x" in reject.raw and "\udc80" > max(reject.raw)  # escaped, no surrogates left


# --------------------------------------------------------------------------- delimiters / columns


def test_sniff_delimiter() -> None:
    assert sniff_delimiter("id\taddress\n") == "\t"
    assert sniff_delimiter("id,address\n") == ","
    assert sniff_delimiter("id,address\n", ".tsv") == "\t"
    assert sniff_delimiter("address\n", ".TAB") == "\t"
    assert sniff_delimiter("address\n") == "\t"  # one column: keep commas inside addresses


def test_tsv_file(tmp_path: Path) -> None:
    text = "poi_id\t地址\t备注\n" + "".join(f"P{i}\t{a}\t有逗号,的备注\n" for i, a in enumerate(ADDRESSES))
    path = _write(tmp_path / "c.txt", text)
    reader = read_catalog(path, id_column="poi_id")
    assert reader.delimiter == "\t"
    assert reader.address_column == "地址" and reader.id_column == "poi_id"
    rows, rejects = _read_all(path, id_column="poi_id")
    assert rejects == []
    assert rows[4] == Row(line=6, address=ADDRESSES[4], source_id="P4", extra={"备注": "有逗号,的备注"})


def test_single_column_file_keeps_commas(tmp_path: Path) -> None:
    path = _write(tmp_path / "one.csv", "address\n北京市朝阳区建国路88号, 3层\n")
    rows, rejects = _read_all(path)
    assert rejects == [] and rows[0].address == "北京市朝阳区建国路88号, 3层"


def test_quoted_csv_fields(tmp_path: Path) -> None:
    path = _write(tmp_path / "q.csv", 'id,address\n1,"北京市朝阳区,建国路88号"\n2,"上海市""浦东""新区"\n')
    rows, rejects = _read_all(path)
    assert rejects == []
    assert [r.address for r in rows] == ["北京市朝阳区,建国路88号", '上海市"浦东"新区']


@pytest.mark.parametrize("name", ["address", "Address", "ADDR", "地址", "full_address", "text", "query"])
def test_address_column_by_name(name: str) -> None:
    header = ["id", "city", name, "phone"]
    assert detect_address_column(header, [["1", "北京市朝阳区", "朝阳区建国路88号", "010"]]) == name
    # a column named like an address whose values are not addresses loses to one whose values are
    assert detect_address_column(header, [["1", "北京市朝阳区建国路88号", "x", "010"]]) == "city"


def test_address_column_by_cjk_content(tmp_path: Path) -> None:
    header = ["编号", "区", "位置", "电话"]
    sample = [["1", "朝阳区", a, "010-1234"] for a in ADDRESSES]
    assert detect_address_column(header, sample) == "位置"

    text = "编号,区,位置,电话\n" + "".join(f"{i},朝阳区,{a},010\n" for i, a in enumerate(ADDRESSES))
    reader = read_catalog(_write(tmp_path / "c.csv", text))
    assert reader.address_column == "位置" and reader.id_column is None


def test_address_column_undetectable(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.csv", "id,phone\n1,010\n2,021\n")
    with pytest.raises(CatalogError, match="--address-column.*'id' .*'phone'"):
        read_catalog(path)


def test_missing_named_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.csv", _csv(ADDRESSES))
    with pytest.raises(CatalogError) as err:
        read_catalog(path, address_column="addr_full")
    assert "'addr_full'" in str(err.value) and "'id', 'address', 'city'" in str(err.value)
    with pytest.raises(CatalogError, match="id column 'poi_id' not found"):
        read_catalog(path, id_column="poi_id")
    # Named columns match case-insensitively when unambiguous.
    assert read_catalog(path, address_column="ADDRESS", id_column="ID").address_column == "address"


@pytest.mark.parametrize(
    ("content", "message"),
    [("", "empty"), ("\n\n", "empty"), ("id,address\n", "no data rows"), ("id,address\n\n  \n", "no data rows")],
)
def test_empty_files(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        read_catalog(_write(tmp_path / "c.csv", content))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        read_catalog(tmp_path / "nope.csv")


# --------------------------------------------------------------------------- per-row validation


def test_empty_and_blank_rows(tmp_path: Path) -> None:
    text = (
        "id,address\n"
        f"1,{ADDRESSES[0]}\n"
        "\n"  # blank line: skipped, not a reject
        "2,\n"
        "3,   \n"
        ",\n"
        f"4,{ADDRESSES[1]}\n"
        "5,　\n"  # ideographic space only
    )
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text), id_column="id")
    assert [(r.line, r.address) for r in rows] == [(2, ADDRESSES[0]), (7, ADDRESSES[1])]
    assert [(r.line, r.reason) for r in rejects] == [
        (4, "empty address in column 'address'"),
        (5, "empty address in column 'address'"),
        (6, "empty address in column 'address'"),
        (8, "empty address in column 'address'"),
    ]
    assert rejects[0].raw == "2,"


def test_empty_id(tmp_path: Path) -> None:
    rows, rejects = _read_all(_write(tmp_path / "c.csv", f"id,address\n ,{ADDRESSES[0]}\n"), id_column="id")
    assert rows == [] and rejects[0].reason == "empty id in column 'id'"


def test_duplicates_by_address(tmp_path: Path) -> None:
    text = "address\n" + f"{ADDRESSES[0]}\n{ADDRESSES[1]}\n北京市 朝阳区 建国路88号\n{ADDRESSES[1]}\n"
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text))
    assert [r.line for r in rows] == [2, 3]
    assert [(r.line, r.reason) for r in rejects] == [
        (4, "duplicate of line 2 (same address)"),  # differs only in whitespace
        (5, "duplicate of line 3 (same address)"),
    ]


def test_duplicates_by_id(tmp_path: Path) -> None:
    text = f"id,address\n7,{ADDRESSES[0]}\n8,{ADDRESSES[0]}\n7,{ADDRESSES[2]}\n"
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text), id_column="id")
    # With an id column the same address twice is fine; the same id twice is not.
    assert [(r.line, r.source_id) for r in rows] == [(2, "7"), (3, "8")]
    assert [(r.line, r.reason) for r in rejects] == [(4, "duplicate of line 2 (same id '7')")]


def test_control_characters(tmp_path: Path) -> None:
    text = f"id,address\n1,北京市\x00朝阳区\n2,上海市\x07浦东\n3,{ADDRESSES[2]}\n4\x1b,{ADDRESSES[3]}\n"
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text), id_column="id")
    assert [r.line for r in rows] == [4]
    assert [(r.line, r.reason) for r in rejects] == [
        (2, "control character U+0000 in column 'address'"),
        (3, "control character U+0007 in column 'address'"),
        (5, "control character U+001B in column 'id'"),
    ]


def test_over_long_address(tmp_path: Path) -> None:
    long = "北京市朝阳区" * 10  # 60 characters
    text = f"address\n{ADDRESSES[0]}\n{long}\n{long[:20]}\n"
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text), max_chars=20)
    assert [r.address for r in rows] == [ADDRESSES[0], long[:20]]  # exactly 20 is allowed
    assert [(r.line, r.reason) for r in rejects] == [
        (3, "address has 60 characters, longer than the model's limit of 20; shorten or split it")
    ]


def test_ragged_rows(tmp_path: Path) -> None:
    text = (
        "id,address,city\n"
        f"1,{ADDRESSES[0]},北京\n"
        f"2,{ADDRESSES[1]}\n"
        "3,广州市天河区,天河路385号,广州\n"
        f"4,{ADDRESSES[3]},深圳\n"
    )
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text), id_column="id")
    assert [r.source_id for r in rows] == ["1", "4"]
    assert [r.line for r in rejects] == [3, 4]
    assert rejects[0].reason.startswith("expected 3 fields, found 2")
    assert rejects[1].reason.startswith("expected 3 fields, found 4")
    assert rejects[1].raw == "3,广州市天河区,天河路385号,广州"


def test_multiline_quoted_record_line_numbers(tmp_path: Path) -> None:
    text = f'id,address,note\n1,{ADDRESSES[0]},"two\nlines"\n2,,x\n3,{ADDRESSES[2]},y\n'
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text), id_column="id")
    assert [(r.line, r.extra["note"]) for r in rows] == [(2, "two\nlines"), (5, "y")]
    assert [r.line for r in rejects] == [4]  # physical line, after the two-line record


def test_crlf_line_endings(tmp_path: Path) -> None:
    text = "id,address\r\n" + "".join(f"{i},{a}\r\n" for i, a in enumerate(ADDRESSES))
    rows, rejects = _read_all(_write(tmp_path / "c.csv", text), id_column="id")
    assert rejects == [] and [r.address for r in rows] == ADDRESSES
    assert [r.line for r in rows] == [2, 3, 4, 5, 6]


# --------------------------------------------------------------------------- chunking / rejects file


def test_chunking(tmp_path: Path) -> None:
    addresses = [f"南京市鼓楼区中山路{i}号" for i in range(10)]
    path = _write(tmp_path / "c.csv", "address\n" + "".join(f"{a}\n" for a in addresses))
    reader = read_catalog(path, chunk_size=3)
    chunks = list(reader.chunks())
    assert len(chunks) == 4
    assert [[r.line for r in rows] for rows, _ in chunks] == [[2, 3, 4], [5, 6, 7], [8, 9, 10], [11]]
    assert all(rejects == [] for _, rejects in chunks)
    assert [r.address for rows, _ in chunks for r in rows] == addresses
    # The reader can be iterated again, from the top.
    assert sum(len(rows) for rows, _ in reader) == 10


def test_chunks_count_rejects_too(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.csv", "address\n" + "".join(f"地址{i}\n" if i % 2 else "\x07\n" for i in range(6)))
    chunks = list(read_catalog(path, chunk_size=4).chunks())
    assert [(len(rows), len(rejects)) for rows, rejects in chunks] == [(2, 2), (1, 1)]


def test_write_rejects(tmp_path: Path) -> None:
    out = tmp_path / "out" / "rejects.tsv"
    assert write_rejects(out, [Reject(3, "empty address in column 'address'", "1,")]) == 1
    write_rejects(out, [Reject(9, "control character U+0007 in column 'address'", "2,a\x07b\tc\nd")])
    write_rejects(out, [])
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines == [
        "line\treason\traw",
        "3\tempty address in column 'address'\t1,",
        "9\tcontrol character U+0007 in column 'address'\t2,a\\x07b\\tc\\nd",
    ]


def test_rejects_from_file_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_bytes(
        codecs.BOM_UTF8 + f"address\n{ADDRESSES[0]}\n\n{ADDRESSES[0]}\n".encode() + b"\xff\xfe bad\n"
    )
    _, rejects = _read_all(path)
    out = tmp_path / "rejects.tsv"
    write_rejects(out, rejects)
    body = out.read_text(encoding="utf-8").splitlines()[1:]
    assert body == [
        f"4\tduplicate of line 2 (same address)\t{ADDRESSES[0]}",
        "5\tundecodable bytes in row; re-save the file as UTF-8\t\\xff\\xfe bad",
    ]


def test_gzipped_tsv_is_read_like_the_plain_file(tmp_path):
    import gzip

    plain = tmp_path / "cat.tsv"
    plain.write_text("id\taddress\n1\t北京市朝阳区建国路88号\n2\t上海市徐汇区漕溪北路1号\n", encoding="utf-8")
    packed = tmp_path / "cat.tsv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    readers = [read_catalog(p, id_column="id") for p in (plain, packed)]
    assert [r.delimiter for r in readers] == ["\t", "\t"]
    chunks = [[(row.line, row.address, row.source_id) for rows, _ in r.chunks() for row in rows] for r in readers]
    assert chunks[0] == chunks[1] == [(2, "北京市朝阳区建国路88号", "1"), (3, "上海市徐汇区漕溪北路1号", "2")]


def test_txt_file_is_one_address_per_line_without_header(tmp_path):
    path = tmp_path / "standard.txt"
    path.write_text("宝安区107国道旁北方骏亿工业区3栋\n光明区光明街道中区14栋36号\n", encoding="utf-8")
    reader = read_catalog(path)
    assert (reader.columns, reader.address_column) == (["address"], "address")
    rows = [row for rows, _ in reader.chunks() for row in rows]
    assert [(r.line, r.address) for r in rows] == [(1, "宝安区107国道旁北方骏亿工业区3栋"), (2, "光明区光明街道中区14栋36号")]
