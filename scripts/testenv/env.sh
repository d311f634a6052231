#!/usr/bin/env bash
# env.sh — print `export` lines that point internal/testenv (and anything
# else) at the servers scripts/testenv/install.sh installed:
#
#   eval "$(scripts/testenv/env.sh)"
#
# Variables already set in the environment win over the defaults. The
# paths are printed even if nothing is installed yet; the tests then skip
# (or, with CI set, fail) naming the install command.
set -euo pipefail

CACHE="${FAULTLINE_CACHE:-$HOME/.cache/faultline}"
KAFKA_VERSION="${FAULTLINE_KAFKA_VERSION:-4.1.1}"
KUBE_VERSION=v1.34.4
ZOOKEEPER_VERSION="${FAULTLINE_ZOOKEEPER_VERSION:-3.9.4}"
CHDB_VERSION="${FAULTLINE_CHDB_VERSION:-26.9.0}"

ch_bin="${FAULTLINE_CLICKHOUSE_BIN:-}"
if [ -z "$ch_bin" ]; then
	for b in clickhouse-server clickhouse /usr/sbin/clickhouse-server /usr/bin/clickhouse; do
		if p=$(command -v "$b" 2>/dev/null); then
			ch_bin=$p
			break
		fi
	done
fi

q() { printf '%q' "$1"; }
echo "export FAULTLINE_CACHE=$(q "$CACHE")"
echo "export FAULTLINE_KAFKA_LIBS=$(q "${FAULTLINE_KAFKA_LIBS:-$CACHE/kafka/$KAFKA_VERSION/libs}")"
echo "export FAULTLINE_CLICKHOUSE_BIN=$(q "${ch_bin:-/usr/sbin/clickhouse-server}")"
echo "export FAULTLINE_ZOOKEEPER_LIBS=$(q "${FAULTLINE_ZOOKEEPER_LIBS:-$CACHE/zookeeper/$ZOOKEEPER_VERSION/libs}")"
echo "export FAULTLINE_CHDB_PYTHON=$(q "${FAULTLINE_CHDB_PYTHON:-$CACHE/chdb/$CHDB_VERSION/venv/bin/python}")"
echo "export FAULTLINE_KUBE_ASSETS=$(q "${FAULTLINE_KUBE_ASSETS:-$CACHE/kube/$KUBE_VERSION}")"
echo "export FAULTLINE_HELM=$(q "${FAULTLINE_HELM:-$CACHE/helm/v4.3.1/helm}")"
