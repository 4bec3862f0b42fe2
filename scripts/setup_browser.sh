#!/usr/bin/env bash
# The browser the map page's test drives (tests/server/test_map_page.py): Debian's chromium,
# through Playwright (installed by scripts/setup.sh; it downloads no browser of its own).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null
else
    echo "setup_browser: install chromium (the map page's browser test needs it)" >&2
    exit 1
fi
