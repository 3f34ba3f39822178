"""The package as its users get it: build the wheel, install it into a fresh virtual environment outside this
checkout with no extras, measure what it brought, run the tour (build → resolve → normalize → match → parse) on
the bundled sample catalog with the network out of reach (``match`` with the accurate profile, so that both
shipped cross-encoders run), then add the ``serve`` extra and answer one request.

    python scripts/wheel_tour.py [--work DIR] [--json] [--no-serve]

Installs go through pip's own configuration (this project's machines serve torch's CPU build from a local
wheel; elsewhere give PIP_INDEX_URL / PIP_EXTRA_INDEX_URL, e.g. https://download.pytorch.org/whl/cpu) and
``scripts/constraints.txt``. Exit status 1, naming the step, when any step fails or the install holds a
package a CPU install must not bring (triton, transformers, a second FAISS). Prints the sizes (MB of
site-packages, the largest packages) as a table, or one JSON object with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: What a CPU install without extras must not hold: the GPU compiler, the training libraries (and SciPy, which
#: LightGBM brings), a FAISS GPU build.
FORBIDDEN = ("triton", "transformers", "lightgbm", "scipy", "faiss_gpu")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "", "no_proxy": "",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}


class StepFailed(Exception):
    pass


def run(step: str, args: list, *, env: dict | None = None, cwd: Path | None = None, timeout: int = 900) -> str:
    done = subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise StepFailed(f"{step}: exit {done.returncode}: " + " | ".join(tail))
    return done.stdout


def megabytes(path: Path) -> float:
    """MiB on disk, as ``du -sm`` counts them (allocated blocks; bytecode pip compiled included)."""
    total = 0
    for root, _dirs, names in os.walk(path):
        total += Path(root).stat().st_blocks * 512  # the folders' own blocks, as du counts them
        for name in names:
            file = Path(root, name)
            if not file.is_symlink():
                total += file.stat().st_blocks * 512
    return total / 2**20


def sizes(site: Path) -> dict:
    """MB of site-packages and of its largest top-level entries (a package with its ``.libs``, dist-info apart)."""
    parts: dict[str, float] = {}
    for entry in site.iterdir():
        name = entry.name.split(".libs")[0] if entry.name.endswith(".libs") else entry.name
        if name.endswith((".dist-info", ".pth")) or name == "__pycache__":
            continue
        size = megabytes(entry) if entry.is_dir() else entry.stat().st_blocks * 512 / 2**20
        parts[name] = parts.get(name, 0.0) + size
    top = dict(sorted(((k, round(v, 1)) for k, v in parts.items()), key=lambda kv: -kv[1])[:8])
    return {"site_packages_mb": round(megabytes(site), 1), "largest_mb": top}


def source_copy(work: Path) -> Path:
    """This checkout's files (tracked and not ignored: ``git ls-files``; without git, the tree less build outputs)
    copied under ``work``, so that building the wheel neither writes ``build/`` here nor packs a stale file from it."""
    src = work / "src"
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode != 0:
        shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                                  "__pycache__", ".pytest_cache", ".hypothesis"))
        return src
    for name in filter(None, listed.stdout.decode("utf-8").split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    return src


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_once(mgeo: Path, index_dir: Path, env: dict, cwd: Path) -> dict:
    """Start ``serve`` on a free loopback port, wait for /readyz (index and models loaded), POST one query, stop it."""
    port = free_port()
    process = subprocess.Popen([str(mgeo), "serve", "--index-dir", str(index_dir), "--port", str(port)],
                               env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never the dead proxy
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise StepFailed(f"serve: exited {process.returncode}: " + (process.stdout.read() or "")[-500:])
            try:
                with opener.open(base + "/readyz", timeout=2):
                    break
            except OSError:  # refused while it starts, 503 while it loads
                if time.monotonic() > deadline:
                    raise StepFailed("serve: /readyz did not say ready within 180 s")
                time.sleep(0.5)
        request = urllib.request.Request(base + "/v1/resolve", method="POST",
                                         data=json.dumps({"query": "深圳南山中山路75号东方科技园9号楼", "top_k": 1}).encode(),
                                         headers={"Content-Type": "application/json"})
        with opener.open(request, timeout=120) as response:
            return json.loads(response.read())
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def tour(work: Path, *, with_serve: bool = True) -> dict:
    report: dict = {"python": sys.version.split()[0]}
    wheels, venv, home = work / "wheels", work / "venv", work / "home"
    home.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run("build the wheel", [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", wheels, source_copy(work)])
    wheel, = wheels.glob("mgeo_index-*.whl")
    report["wheel_mb"] = round(wheel.stat().st_size / 2**20, 1)
    run("create a fresh venv", [sys.executable, "-m", "venv", venv])
    python, mgeo = venv / "bin" / "python", venv / "bin" / "mgeo-index"
    pip = [python, "-m", "pip", "install", "-q", "-c", REPO / "scripts" / "constraints.txt"]
    run("pip install the wheel (no extras)", [*pip, wheel], cwd=home)
    report["install_s"] = round(time.monotonic() - started, 1)
    site = Path(run("find site-packages", [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    report.update(sizes(site))
    present = sorted(name for name in os.listdir(site) for bad in FORBIDDEN if name.lower().startswith(bad))
    if present:
        raise StepFailed(f"a CPU install without extras brought {', '.join(present)}")
    report["faiss_builds"] = json.loads(run("list FAISS builds", [
        python, "-c", "import json, warnings; warnings.simplefilter('error'); "
                      "from mgeo_index.index import faiss_index; print(json.dumps(faiss_index.faiss_builds()))"], cwd=home))

    env = {**os.environ, **OFFLINE, "PYTHONPATH": ""}
    env.pop("VIRTUAL_ENV", None)
    where = run("import from the venv", [python, "-c", "import mgeo_index; print(mgeo_index.__file__)"], env=env, cwd=home)
    if not where.startswith(str(venv)):
        raise StepFailed(f"mgeo_index imported from {where.strip()}, not from the fresh venv")
    catalog = Path(where.strip()).parent / "data" / "sample_catalog.csv"
    index_dir = home / "idx"
    steps: dict[str, float] = {}

    def timed(step: str, args: list) -> str:
        began = time.monotonic()
        out = run(step, [mgeo, *args], env=env, cwd=home)
        steps[step] = round(time.monotonic() - began, 1)
        return out

    timed("build", ["build", catalog, "--index-dir", index_dir, "--id-column", "poi_id"])
    answers = json.loads(timed("resolve", ["resolve", "深圳南山中山路75号东方科技园9号楼", "--index-dir", index_dir,
                                           "--top-k", "3", "--json"]))
    first = (answers[0] if isinstance(answers, list) else answers)["matches"][0]
    if first["source_id"] != "P0001" or first["label"] != "exact_match":
        raise StepFailed(f"resolve: first answer {first['source_id']} {first['label']}, expected P0001 exact_match")
    stores = home / "stores.csv"
    stores.write_text("store,address\nA,北京海淀东风路127号东方大厦\nB,上海市浦东新区世纪大道100号\n", encoding="utf-8")
    timed("normalize", ["normalize", stores, "--index-dir", index_dir, "--out", home / "stores.out.csv"])
    rows = (home / "stores.out.csv").read_text(encoding="utf-8-sig").splitlines()
    if len(rows) != 3 or "P0003" not in rows[1]:
        raise StepFailed(f"normalize: expected store A tied to P0003, got {rows[1:]}")
    pairs = home / "pairs.tsv"
    pairs.write_text("a\tb\n北京朝阳建国路88号\t北京市朝阳区建国路88号\n北京朝阳建国路88号\t上海市浦东新区世纪大道100号\n",
                     encoding="utf-8")
    timed("match", ["match", "--file", pairs, "--out", home / "pairs.out.tsv", "--profile", "accurate"])  # both models ship
    labels = [line.split("\t")[2] for line in (home / "pairs.out.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    if labels != ["exact_match", "not_match"]:
        raise StepFailed(f"match: labels {labels}, expected exact_match, not_match")
    parsed = json.loads(timed("parse", ["parse", "北京朝阳建国路88号", "--json"]))
    if (parsed[0] if isinstance(parsed, list) else parsed)["admin"]["district"] != "朝阳区":
        raise StepFailed(f"parse: {parsed}")
    report["tour_s"] = steps
    if with_serve:
        began = time.monotonic()
        run("pip install the serve extra", [*pip, f"{wheel}[serve]"], cwd=home)
        report["serve_extra_mb"] = round(megabytes(site) - report["site_packages_mb"], 1)
        answer = serve_once(mgeo, index_dir, env, home)
        results = answer.get("results") or [answer]
        if results[0]["matches"][0]["source_id"] != "P0001":
            raise StepFailed(f"serve: {answer}")
        steps["serve"] = round(time.monotonic() - began, 1)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="where the wheel, venv and tour files go (default: a temporary folder, removed)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--no-serve", action="store_true", help="skip the serve extra and its request")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="mgeo-wheel-"))
    try:
        report = tour(work, with_serve=not args.no_serve)
    except StepFailed as exc:
        print(f"wheel tour failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        for key, value in report.items():
            print(f"{key:18} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
