#!/usr/bin/env bash
# Render a specmoe HTML report in headless Chromium to a PNG, to check that the page reads well.
#
#   scripts/check_report.sh RESULTS_DIR [OUT_PNG]
#
# Writes RESULTS_DIR/report.html with `specmoe report` (unless REPORT=path/to/page.html is set)
# and screenshots it to OUT_PNG (default: beside the page, report.png). Installs Chromium with
# apt-get when it is missing and the script runs as root (CI machines start fresh).
set -euo pipefail

dir=${1:?usage: scripts/check_report.sh RESULTS_DIR [OUT_PNG]}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
[ -x "$py" ] || py=python3

page=${REPORT:-$dir/report.html}
if [ -z "${REPORT:-}" ]; then
    "$py" -m specmoe.cli report "$dir" --out "$page"
fi
png=${2:-${page%.html}.png}

browser=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "check_report: installing chromium" >&2
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
        browser=chromium
    else
        echo "check_report: chromium is not installed (apt-get install chromium)" >&2
        exit 1
    fi
fi

abs_page=$(cd "$(dirname "$page")" && pwd)/$(basename "$page")
mkdir -p "$(dirname "$png")"
tmp_png="$(dirname "$png")/.$(basename "$png").tmp.png"
profile=$(mktemp -d)
trap 'rm -rf "$profile" "$tmp_png"' EXIT
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
    --user-data-dir="$profile" --screenshot="$tmp_png" --window-size=1200,3000 \
    "file://$abs_page" >/dev/null 2>&1
if [ ! -s "$tmp_png" ]; then
    echo "check_report: chromium wrote no screenshot of $page" >&2
    exit 1
fi
mv "$tmp_png" "$png"
echo "check_report: $page -> $png" >&2
