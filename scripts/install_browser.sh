#!/usr/bin/env bash
# Installs Debian's chromium and chromium-driver for the browser test of the review page
# (tests/test_review_browser.py drives headless chromium with Selenium), with a small CJK font so
# that the screenshot (docs/review.png) shows the addresses. A no-op when both are
# present; where apt-get is unavailable (not Debian/Ubuntu, or not root without sudo) it says so and
# exits 0: the browser test then skips, naming what is missing.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have chromium && have chromedriver; then
    echo "install_browser: chromium and chromedriver are present"
    exit 0
fi
if ! have apt-get; then
    echo "install_browser: apt-get is not available; install chromium and chromedriver yourself to run the browser test"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if have sudo && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install_browser: not root and no passwordless sudo; the browser test will skip"
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver fonts-wqy-microhei; }; then
    echo "install_browser: apt-get could not install chromium / chromium-driver; the browser test will skip"
    exit 0
fi
echo "install_browser: installed $(chromium --version 2>/dev/null || echo chromium) and $(chromedriver --version 2>/dev/null | head -1)"
