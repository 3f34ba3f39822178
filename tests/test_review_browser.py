"""The review page in a real browser: headless Debian chromium driven by Selenium, keyboard only.

`bash scripts/install.sh --browser` (what `.ci/run` calls) installs chromium and chromium-driver; without them
this test skips, saying so. With MGEO_REVIEW_SCREENSHOT=path it also saves a screenshot of the page
showing a real item (how docs/review.png is made:
`MGEO_REVIEW_SCREENSHOT=docs/review.png .venv/bin/python -m pytest tests/test_review_browser.py`).
"""
import getpass
import os
import shutil
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")
pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[dev]')")

import uvicorn  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoAlertPresentException, WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from mgeo_index import AddressIndex, store  # noqa: E402
from mgeo_index.review.app import LOOPBACK_HOSTS, ReviewState, create_app  # noqa: E402
from mgeo_index.review.queue import open_queue  # noqa: E402
from conftest import copy_index  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
SCRIPT = "<script>alert(1)</script>"
QUERIES = [
    "深圳南山中山路75号东方科技园9号楼", "南京鼓楼中山路89号星河广场", "海淀东风路127号东方大厦",
    "南京挹江门胜利路48号东方大厦", "徐汇黄河路574号金地酒店", "南京鼓楼友谊路碧桂广场",
    "深圳南山桃源街道胜利路84号绿地小区", "上海徐汇建设路783号东方大厦", "青岛市南东风路817号海岸医院",
    "成都武侯黄河路663号阳光大酒店", "青岛湛山人民路964号碧桂公寓", "杭州西湖科技路650号东方花园", SCRIPT,
]
# Ten decisions, keyboard only: (keys, decision, 1-based candidate or None); the last one is then undone.
KEYS = [("1", "exact", 1), ("2", "exact", 2), ("n", "none", None), ("s", "skip", None), ("p3", "partial", 3),
        ("1", "exact", 1), ("p\n", "partial", 1), ("s", "skip", None), ("1", "exact", 1), ("n", "none", None)]

needs_browser = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium and chromedriver are needed (bash scripts/install.sh --browser installs Debian's chromium and "
           f"chromium-driver); missing: {', '.join(n for n, p in (('chromium', CHROMIUM), ('chromedriver', CHROMEDRIVER)) if p is None)}",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving ``app`` on 127.0.0.1:``port`` in a thread."""

    def __init__(self, app, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the review server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def chromium():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1180",
                "--lang=en-US", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def _detached(element) -> bool:
    """Whether ``element`` left the document (the page was replaced). Chromium sometimes answers for a node
    of the old page with "Node with given id does not belong to the document" (a plain WebDriverException)
    rather than a stale-element error: both mean gone."""
    try:
        element.is_enabled()
        return False
    except WebDriverException:  # StaleElementReferenceException is one too
        return True


def press(driver, keys: str) -> None:
    """Type ``keys`` to the page (no element focused: the page's own key handler), then wait for the next page."""
    body = driver.find_element(By.TAG_NAME, "body")
    actions = ActionChains(driver)
    for key in keys:
        actions.send_keys(Keys.ENTER if key == "\n" else key)
    actions.perform()
    WebDriverWait(driver, 10).until(lambda _: _detached(body))
    WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")


@needs_browser
def test_label_ten_items_by_keyboard(sample_index, tmp_path):
    index_dir = copy_index(sample_index, tmp_path / "idx")
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(QUERIES) + "\n", encoding="utf-8")
    index = AddressIndex.open(index_dir, device="cpu")
    engine = index.resolver.engine
    info = open_queue(index, file=queries)
    assert info.counts["pending"] == len(QUERIES)
    reviewer = getpass.getuser()
    state = ReviewState(engine=engine, queue=info.name, model_version=info.model_version, local_user=reviewer)
    port = free_port()
    shot = os.environ.get("MGEO_REVIEW_SCREENSHOT")
    decided: list[tuple[int, str, int | None]] = []
    with ServerThread(create_app(state, allowed_hosts=LOOPBACK_HOSTS), port):
        driver = chromium()
        try:
            driver.get(f"http://127.0.0.1:{port}/")
            for keys, decision, candidate in KEYS:
                item_id = int(driver.find_element(By.ID, "item").get_attribute("data-item-id"))
                query = driver.find_element(By.ID, "query").text
                assert query in QUERIES  # shown as text, whatever it holds
                if query == SCRIPT:
                    with pytest.raises(NoAlertPresentException):
                        driver.switch_to.alert.text  # noqa: B018 - the script was not run
                    assert not driver.find_elements(By.CSS_SELECTOR, "#query script")
                if shot and query != SCRIPT and len(driver.find_elements(By.CSS_SELECTOR, "li.candidate")) >= 3:
                    driver.save_screenshot(shot)  # a real item with its candidates and explanations
                    shot = None
                press(driver, keys)
                decided.append((item_id, decision, candidate))
            progress = driver.find_element(By.ID, "progress").text
            assert "10 / 13 reviewed" in progress
            press(driver, "u")  # undo the last decision: its item is shown again
            assert "undone" in driver.find_element(By.ID, "flash").text
            assert int(driver.find_element(By.ID, "item").get_attribute("data-item-id")) == decided[-1][0]
            assert "9 / 13 reviewed" in driver.find_element(By.ID, "progress").text
        finally:
            driver.quit()

    labels = store.list_labels(engine, include_undone=True)
    by_item: dict[int, list[dict]] = {}
    for row in labels:
        by_item.setdefault(row["item_id"], []).append(row)
    expected_label = {"exact": "exact_match", "partial": "partial_match", "none": "not_match"}
    for n, (item_id, decision, candidate) in enumerate(decided):
        item = store.get_review_item(engine, item_id)
        rows = by_item.get(item_id, [])
        undone = n == len(decided) - 1
        assert item["status"] == ("pending" if undone else "skipped" if decision == "skip" else "decided")
        if decision == "skip":
            assert rows == []
            continue
        shown = item["candidates"]
        wanted = [shown[candidate - 1]["id"]] if candidate else [c["id"] for c in shown]
        assert sorted(r["entry_id"] for r in rows) == sorted(wanted)
        assert {r["label"] for r in rows} == {expected_label[decision]}
        assert {r["reviewer"] for r in rows} == {reviewer}
        assert all((r["undone_at"] is not None) == undone for r in rows)
    assert len(store.list_labels(engine)) == sum(
        0 if d == "skip" else 1 if c else len(store.get_review_item(engine, i)["candidates"]) for i, d, c in decided[:-1])
    index.close()

    # a query confirmed as exact (candidate 2 of the second item) is answered first, as confirmed
    item_id, _, candidate = decided[1]
    item = store.get_review_item(engine, item_id)
    chosen = item["candidates"][candidate - 1]["id"]
    with AddressIndex.open(index_dir, device="cpu") as reopened:
        best = reopened.resolve(item["query"])[0]
    assert best.id == chosen
    assert getattr(best, "source", None) == "confirmed"
