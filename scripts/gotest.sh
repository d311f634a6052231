#!/usr/bin/env bash
# go test FLAGS... -- PACKAGES..., and once more for each package that
# failed while one of its test servers crashed.
#
# The servers are real and old ones among them can die on their own: the
# project's CI saw Debian's ClickHouse 18.16 (the stand-in server,
# sql/README.md) take a fatal signal mid-query, hang for the 10 s its
# crash handler sleeps, and exit, failing every later step of the test.
# testenv reports such an exit with a line holding CrashMarker and the
# server's crash lines. A failed package whose output has that line runs
# once more, and the run passes only if that rerun passes; any other
# failure fails the run at once.
set -uo pipefail
GO=${GO:-go}
marker='testenv: server crashed:' # internal/testenv.CrashMarker
flags=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
if [ "${1:-}" != -- ]; then
  echo "usage: scripts/gotest.sh [go test flags] -- packages..." >&2
  exit 2
fi
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$GO" test "${flags[@]}" "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && exit 0
# go test prints each package's output together, ending with its ok/FAIL
# line: a package failed "with a crash" when the marker is in its block.
failed=$(awk -F'\t' '/^FAIL\t/ { print $2 }' "$out" | sort -u)
crashed=$(awk -F'\t' -v m="$marker" 'index($0, m) { c = 1 } /^(ok  |FAIL|\?   )\t/ { if ($1 == "FAIL" && c) print $2; c = 0 }' "$out" | sort -u)
if [ -z "$failed" ] || [ "$failed" != "$crashed" ]; then
  exit "$rc"
fi
echo "gotest: a test server crashed under" $crashed "(testenv's report above, '$marker'); running once more"
"$GO" test "${flags[@]}" $crashed
