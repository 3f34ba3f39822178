"""Generate the bundled sample catalog (mgeo_index/data/sample_catalog.csv).

Made by the project from public administrative data only (official province / city / district /
town names from ../shared/data/admin) plus generated road names, house numbers and POI names, so
it can ship with the package. Deterministic: the same data and seed give the same file.

    python scripts/make_sample_catalog.py --data ../shared/data --rows 300
"""
from __future__ import annotations

import argparse
import csv
import gzip
import random
from pathlib import Path

DISTRICTS = [  # (province, city, district) pairs picked from the official tree
    ("北京市", "北京市", "朝阳区"), ("北京市", "北京市", "海淀区"), ("上海市", "上海市", "徐汇区"),
    ("上海市", "上海市", "浦东新区"), ("广东省", "广州市", "天河区"), ("广东省", "深圳市", "南山区"),
    ("浙江省", "杭州市", "西湖区"), ("四川省", "成都市", "武侯区"), ("湖北省", "武汉市", "洪山区"),
    ("江苏省", "南京市", "鼓楼区"), ("陕西省", "西安市", "雁塔区"), ("山东省", "青岛市", "市南区"),
]
ROADS = ["人民路", "中山路", "建设路", "解放路", "和平路", "新华路", "文化路", "胜利路", "长江路", "黄河路",
         "光明路", "友谊路", "青年路", "迎宾大道", "学府路", "科技路", "滨江路", "南京路", "东风路", "朝阳路"]
BRANDS = ["阳光", "金地", "华润", "绿地", "锦绣", "翠苑", "东方", "世纪", "星河", "海岸", "碧桂", "君悦", "天悦", "龙湖"]
KINDS = ["大厦", "花园", "小区", "广场", "中心", "公寓", "商城", "医院", "中学", "酒店", "科技园", "大酒店"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "mgeo_index" / "data" / "sample_catalog.csv")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    towns: dict[tuple[str, str, str], list[str]] = {}
    with gzip.open(args.data / "admin" / "jionlp_4level.csv.gz", "rt", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            key = (row["province"], row["city"], row["county"])
            if row["level"] == "4" and key in DISTRICTS:
                towns.setdefault(key, []).append(row["name"])
    missing = [d for d in DISTRICTS if d not in towns]
    if missing:
        raise SystemExit(f"districts not found in the admin data: {missing}")

    seen: set[str] = set()
    rows = []
    while len(rows) < args.rows:
        province, city, district = rng.choice(DISTRICTS)
        town = rng.choice(towns[(province, city, district)])
        name = rng.choice(BRANDS) + rng.choice(KINDS)
        road, number = rng.choice(ROADS), rng.randint(1, 999)
        detail = rng.choice(["", f"{rng.randint(1, 30)}栋", f"{rng.randint(1, 12)}号楼", f"{rng.randint(1, 6)}单元"])
        upper = province + city if province != city else city
        address = f"{upper}{district}{town}{road}{number}号{name}{detail}"
        if address in seen:
            continue
        seen.add(address)
        rows.append({"poi_id": f"P{len(rows) + 1:04d}", "name": name, "address": address, "city": city})

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["poi_id", "name", "address", "city"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
