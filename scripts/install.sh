#!/usr/bin/env bash
# Create .venv (if missing) and install mgeo-index with its test dependencies from this checkout.
# torch comes first, from scripts/constraints.txt (the CPU wheel the tests and benchmarks run on), so that
# nothing pulls a multi-GB CUDA build; the rest is held to the same constraints.
#   bash scripts/install.sh [--browser]
# --browser also installs Debian's chromium and chromium-driver for the browser test of the review page
# (tests/test_review_browser.py drives headless chromium with Selenium), with a small CJK font so that the
# screenshot (docs/review.png) shows the addresses: a no-op when both are present; where apt-get is unavailable
# (not Debian/Ubuntu, or not root without sudo) it says so and goes on: the browser test then skips, naming what
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

have() { command -v "$1" >/dev/null 2>&1; }

install_browser() {
    if have chromium && have chromedriver; then
        echo "browser: chromium and chromedriver are present"
        return
    fi
    if ! have apt-get; then
        echo "browser: apt-get is not available; install chromium and chromedriver yourself to run the browser test"
        return
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if have sudo && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "browser: not root and no passwordless sudo; the browser test will skip"
            return
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! { $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver fonts-wqy-microhei; }; then
        echo "browser: apt-get could not install chromium / chromium-driver; the browser test will skip"
        return
    fi
    echo "browser: installed $(chromium --version 2>/dev/null || echo chromium) and $(chromedriver --version 2>/dev/null | head -1)"
}

case "${1:-}" in
    "") ;;
    --browser) install_browser ;;
    *) echo "usage: bash scripts/install.sh [--browser]" >&2; exit 2 ;;
esac
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -c scripts/constraints.txt torch
.venv/bin/python -m pip install -q -c scripts/constraints.txt -e ".[dev]"
echo "installed: $(.venv/bin/mgeo-index --help >/dev/null && echo mgeo-index) into .venv"
