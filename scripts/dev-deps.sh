#!/usr/bin/env bash
# Installs (idempotently) what `make run` needs beyond Go: the ClickHouse
# server binary that `faultline dev` starts for itself.
set -euo pipefail
if command -v clickhouse-server >/dev/null || command -v clickhouse >/dev/null; then
  exit 0
fi
echo "make run: installing clickhouse-server (Debian package) for the local fault history" >&2
sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
$sudo apt-get install -y clickhouse-server clickhouse-client >/dev/null \
  || { echo "make run: could not install; run: apt-get install -y clickhouse-server clickhouse-client" >&2; exit 1; }
