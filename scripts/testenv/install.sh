#!/usr/bin/env bash
# install.sh [kafka|clickhouse|zookeeper|chdb|sushy|moto|promtool|chromium|kube|helm|all]... — install the real
# servers that the integration tests (internal/testenv) start: ClickHouse,
# Apache Kafka, ZooKeeper (for replicated ClickHouse), a Kubernetes control
# plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok), chdb-core (a current ClickHouse engine in-process, to check the SQL
# on it) and the helm CLI (the chart's tests).
#
# Idempotent: everything is cached in ${FAULTLINE_CACHE:-$HOME/.cache/faultline},
# keyed by version, and a component that is already there is a fast no-op.
# Prints one line per component: "testenv: <name> <version> <path>".
#
# Measured on a 2-core Debian 12 machine shared with other builds (load
# 6-25); details in README.md:
#   clickhouse  apt-get install 18.16.1: 17 s cold
#   kafka       mvn copy-dependencies, kafka_2.13 4.1.1 + slf4j2/log4j2 binding:
#               42 s with an empty ~/.m2 (12 s warm), 43 MB; plus 6 s to format
#               the KRaft template. Verified: KRaft combined mode
#               (process.roles=broker,controller, static quorum, node.id=1)
#               starts with Java 17 and -Xmx512m; ready in 9-18 s on the busy
#               machine (CPU-bound; C1-only JIT halves it), ~310 MB RSS,
#               graceful stop 1-1.6 s.
#   kube, tools the Go builds (etcd and the kube binaries; promtool, helm
#               and kwok): the cold `make test` times in README.md.
#   warm no-op for all components: 0.3 s
set -euo pipefail

CACHE="${FAULTLINE_CACHE:-$HOME/.cache/faultline}"
KAFKA_VERSION="${FAULTLINE_KAFKA_VERSION:-4.1.1}"
SCALA_VERSION=2.13
KUBE_VERSION=v1.34.4
KUBE_STAGING_VERSION=v0.34.4
ETCD_VERSION=v3.6.4
KWOK_VERSION=v0.8.0
ZOOKEEPER_VERSION="${FAULTLINE_ZOOKEEPER_VERSION:-3.9.4}"
CHDB_VERSION="${FAULTLINE_CHDB_VERSION:-26.9.0}"
SUSHY_VERSION="${FAULTLINE_SUSHY_VERSION:-2.2.0}"
MOTO_VERSION="${FAULTLINE_MOTO_VERSION:-5.2.5}"
HELM_VERSION=v4.3.1
PROMTOOL_VERSION=v0.316.0

log() { printf 'testenv: %s\n' "$*" >&2; }
die() { printf 'testenv: error: %s\n' "$*" >&2; exit 1; }

# with_lock NAME CMD... runs CMD holding an exclusive lock so that two
# concurrent installs (two CI jobs, a developer and a test) do not race.
with_lock() {
	local name=$1
	shift
	mkdir -p "$CACHE/locks"
	(
		flock 9
		"$@"
	) 9>"$CACHE/locks/$name.lock"
}

as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	else
		sudo "$@"
	fi
}

# ---------------------------------------------------------------- clickhouse

clickhouse_bin() {
	local b
	for b in clickhouse-server clickhouse; do
		if command -v "$b" >/dev/null 2>&1; then
			command -v "$b"
			return 0
		fi
	done
	return 1
}

install_clickhouse() {
	local bin
	if ! bin=$(clickhouse_bin); then
		log "installing clickhouse-server from apt"
		export DEBIAN_FRONTEND=noninteractive
		if ! as_root apt-get install -y --no-install-recommends clickhouse-server clickhouse-client >&2; then
			as_root apt-get update >&2
			as_root apt-get install -y --no-install-recommends clickhouse-server clickhouse-client >&2
		fi
		bin=$(clickhouse_bin) || die "clickhouse-server not found after apt-get install"
	fi
	local ver
	ver=$(dpkg-query -W -f='${Version}' clickhouse-server 2>/dev/null || echo unknown)
	echo "testenv: clickhouse $ver $bin"
}

# maven_libs BUILD NAME GROUP:ARTIFACT:VERSION... copies the runtime jars
# of the artifacts and of everything they depend on from Maven Central into
# BUILD/libs, through a pom of those dependencies (NAME is its artifactId).
maven_libs() {
	local build=$1 name=$2 dep g a v
	shift 2
	{
		printf '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
		printf '  <modelVersion>4.0.0</modelVersion>\n  <groupId>faultline.testenv</groupId>\n'
		printf '  <artifactId>%s</artifactId>\n  <version>1</version>\n  <packaging>pom</packaging>\n  <dependencies>\n' "$name"
		for dep in "$@"; do
			IFS=: read -r g a v <<<"$dep"
			printf '    <dependency><groupId>%s</groupId><artifactId>%s</artifactId><version>%s</version></dependency>\n' "$g" "$a" "$v"
		done
		printf '  </dependencies>\n</project>\n'
	} >"$build/pom.xml"
	(cd "$build" && mvn -B -q -Dstyle.color=never -f pom.xml \
		dependency:copy-dependencies \
		-DincludeScope=runtime \
		-DoutputDirectory="$build/libs") >"$build/mvn.log" 2>&1 ||
		die "mvn dependency:copy-dependencies failed: $(tail -n 30 "$build/mvn.log")"
}

# --------------------------------------------------------------------- kafka

install_kafka() {
	local dir="$CACHE/kafka/$KAFKA_VERSION"
	if [ ! -f "$dir/.complete" ]; then
		log "fetching kafka_$SCALA_VERSION $KAFKA_VERSION jars from Maven Central"
		local build="$CACHE/build/kafka-$KAFKA_VERSION"
		rm -rf "$build" "$dir"
		mkdir -p "$build"
		# kafka_2.13 brings the broker, kafka.tools.StorageTool and the
		# metadata/raft/server modules; slf4j-api 2 + log4j-slf4j2-impl +
		# log4j-core give it logging (kafka_2.13 declares no binding itself and
		# its transitive slf4j-api 1.7 cannot see an slf4j2 provider).
		maven_libs "$build" kafka-libs "org.apache.kafka:kafka_$SCALA_VERSION:$KAFKA_VERSION" \
			org.slf4j:slf4j-api:2.0.17 org.apache.logging.log4j:log4j-slf4j2-impl:2.24.3 \
			org.apache.logging.log4j:log4j-core:2.24.3
		ls "$build"/libs/kafka_"$SCALA_VERSION"-"$KAFKA_VERSION".jar >/dev/null ||
			die "kafka_$SCALA_VERSION-$KAFKA_VERSION.jar missing after mvn"
		mkdir -p "$dir"
		mv "$build/libs" "$dir/libs"
		cat >"$dir/log4j2.properties" <<'EOF'
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.org.name = org.apache.kafka
logger.org.level = INFO
EOF
		touch "$dir/.complete"
		rm -rf "$build"
	fi
	if [ ! -f "$dir/kraft-template/meta.properties" ]; then
		kafka_template "$dir"
	fi
	echo "testenv: kafka $KAFKA_VERSION $dir/libs"
}

# kafka_template DIR formats a KRaft log dir once (node.id=1, static
# quorum) into DIR/kraft-template: internal/testenv copies it into each
# broker's empty log dir instead of running kafka.tools.StorageTool, which
# costs a JVM start (1.5 s idle, 3-7 s on a busy 2-core machine) per broker.
kafka_template() {
	local dir=$1
	local tmp="$dir/kraft-template.tmp"
	rm -rf "$tmp"
	mkdir -p "$tmp/data"
	{
		echo "process.roles=broker,controller"
		echo "node.id=1"
		echo "controller.quorum.voters=1@127.0.0.1:9093"
		echo "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
		echo "controller.listener.names=CONTROLLER"
		echo "log.dirs=$tmp/data"
	} >"$tmp/server.properties"
	local id
	id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
	java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
		-Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$dir/libs/*" \
		kafka.tools.StorageTool format -t "$id" -c "$tmp/server.properties" >"$tmp/format.log" 2>&1 ||
		die "kafka StorageTool format failed: $(tail -n 20 "$tmp/format.log")"
	rm -rf "$dir/kraft-template"
	mv "$tmp/data" "$dir/kraft-template"
	rm -rf "$tmp"
}


# ----------------------------------------------------------------- zookeeper

# install_zookeeper fetches the ZooKeeper server jars (for replicated
# ClickHouse: ON CLUSTER DDL and Replicated* tables) from Maven Central like
# the Kafka jars. org.apache.zookeeper:zookeeper declares metrics-core and
# snappy-java "provided" and no slf4j binding, so they are named here.
install_zookeeper() {
	local dir="$CACHE/zookeeper/$ZOOKEEPER_VERSION"
	if [ ! -f "$dir/.complete" ]; then
		log "fetching zookeeper $ZOOKEEPER_VERSION jars from Maven Central"
		local build="$CACHE/build/zookeeper-$ZOOKEEPER_VERSION"
		rm -rf "$build" "$dir"
		mkdir -p "$build"
		maven_libs "$build" zookeeper-libs "org.apache.zookeeper:zookeeper:$ZOOKEEPER_VERSION" \
			io.dropwizard.metrics:metrics-core:4.1.12.1 org.xerial.snappy:snappy-java:1.1.10.5 \
			org.slf4j:slf4j-simple:2.0.13
		ls "$build/libs/zookeeper-$ZOOKEEPER_VERSION.jar" >/dev/null ||
			die "zookeeper-$ZOOKEEPER_VERSION.jar missing after mvn"
		mkdir -p "$dir"
		mv "$build/libs" "$dir/libs"
		touch "$dir/.complete"
		rm -rf "$build"
	fi
	echo "testenv: zookeeper $ZOOKEEPER_VERSION $dir/libs"
}

# ---------------------------------------------------------------------- chdb

# install_chdb makes a Python venv with chdb-core pinned (PyPI; ClickHouse
# 26.x in-process, ~180 MB wheel) under $CACHE/chdb/<version>/venv. The SQL
# check (sql/compat_test.go) runs scripts/testenv/chdb_run.py with it.
install_chdb() {
	local dir="$CACHE/chdb/$CHDB_VERSION"
	if [ ! -f "$dir/.complete" ]; then
		local py
		py=$(command -v python3) || die "python3 is not on PATH (needed for chdb-core)"
		log "installing chdb-core $CHDB_VERSION from PyPI into $dir/venv"
		rm -rf "$dir"
		mkdir -p "$dir"
		if ! "$py" -m venv "$dir/venv.tmp" >&2; then
			# Debian's python3 needs python3-venv (ensurepip) for this.
			log "python3 -m venv failed; installing python3-venv from apt"
			rm -rf "$dir/venv.tmp"
			export DEBIAN_FRONTEND=noninteractive
			as_root apt-get install -y --no-install-recommends python3-venv >&2 ||
				{ as_root apt-get update >&2 && as_root apt-get install -y --no-install-recommends python3-venv >&2; } ||
				die "python3 -m venv failed and python3-venv could not be installed"
			"$py" -m venv "$dir/venv.tmp" >&2 || die "python3 -m venv failed"
		fi
		"$dir/venv.tmp/bin/pip" install -q --disable-pip-version-check "chdb-core==$CHDB_VERSION" >&2 ||
			die "pip install chdb-core==$CHDB_VERSION failed"
		# A venv records its own path in its scripts; the interpreter and
		# site-packages are what the check uses, so the rename is safe.
		mv "$dir/venv.tmp" "$dir/venv"
		"$dir/venv/bin/python" -c 'import chdb' >&2 || die "chdb does not import after install"
		touch "$dir/.complete"
	fi
	echo "testenv: chdb $CHDB_VERSION $dir/venv/bin/python"
}

# ------------------------------------------------------------- sushy, moto

# py_venv NAME VERSION IMPORT PIP-SPEC... makes a Python venv at
# $CACHE/NAME/VERSION/venv with the pinned PIP-SPECs (PyPI), checks that
# IMPORT imports, and prints the summary line. The venv is made in place
# (its console scripts name their own path) and counts as installed only
# once .complete is written; an interrupted install is redone.
py_venv() {
	local name=$1 version=$2 import=$3
	shift 3
	local dir="$CACHE/$name/$version"
	if [ ! -f "$dir/.complete" ]; then
		local py
		py=$(command -v python3) || die "python3 is not on PATH (needed for $name)"
		log "installing $* from PyPI into $dir/venv"
		rm -rf "$dir"
		mkdir -p "$dir"
		if ! "$py" -m venv "$dir/venv" >&2; then
			log "python3 -m venv failed; installing python3-venv from apt"
			rm -rf "$dir/venv"
			export DEBIAN_FRONTEND=noninteractive
			as_root apt-get install -y --no-install-recommends python3-venv >&2 ||
				{ as_root apt-get update >&2 && as_root apt-get install -y --no-install-recommends python3-venv >&2; } ||
				die "python3 -m venv failed and python3-venv could not be installed"
			"$py" -m venv "$dir/venv" >&2 || die "python3 -m venv failed"
		fi
		"$dir/venv/bin/pip" install -q --disable-pip-version-check "$@" >&2 || die "pip install $* failed"
		"$dir/venv/bin/python" -c "import $import" >&2 || die "$import does not import after install"
		touch "$dir/.complete"
	fi
	echo "testenv: $name $version $dir/venv/bin/python"
}

# install_sushy: sushy-tools (PyPI, OpenStack's Redfish emulator) pinned, for
# the janitor's Redfish provider tests: `python -m sushy_tools.emulator.main
# --config F` with SUSHY_EMULATOR_FAKE_DRIVER serves emulated systems whose
# PowerState a ComputerSystem.Reset really changes (internal/testenv
# StartSushy).
install_sushy() { py_venv sushy "$SUSHY_VERSION" sushy_tools.emulator.main "sushy-tools==$SUSHY_VERSION"; }

# install_moto: moto's server mode (PyPI moto[server]) pinned, for the
# janitor's AWS provider and maintenance monitor tests (EC2 RebootInstances,
# TerminateInstances, DescribeInstanceStatus; internal/testenv StartMoto).
install_moto() { py_venv moto "$MOTO_VERSION" moto.server "moto[server]==$MOTO_VERSION"; }
# ------------------------------------------------------------------ chromium

# install_chromium installs Debian's chromium and chromium-driver (the
# headless browser the gateway's /ui/ test drives through chromedp).
# Debian's package is the pin: the version is whatever the release ships,
# recorded in the output line.
install_chromium() {
	if ! command -v chromium >/dev/null 2>&1; then
		log "installing chromium + chromium-driver from apt"
		export DEBIAN_FRONTEND=noninteractive
		if ! as_root apt-get install -y --no-install-recommends chromium chromium-driver >&2; then
			as_root apt-get update >&2
			as_root apt-get install -y --no-install-recommends chromium chromium-driver >&2
		fi
		command -v chromium >/dev/null 2>&1 || die "chromium not found after apt-get install"
	fi
	local ver
	ver=$(dpkg-query -W -f='${Version}' chromium 2>/dev/null || echo unknown)
	echo "testenv: chromium $ver $(command -v chromium)"
}

# ------------------------------------------------------------ the Go builds

# The Go-built servers and tools come from the Go module proxy, built in two
# throwaway modules under $CACHE/build with the default Go module and build
# caches (so CI reuses them). Each module builds all its missing binaries in
# one `go build`: the packages they share (k8s.io/api, client-go, grpc, ...)
# compile once, at one version, and go's scheduler keeps both cores busy
# across the binaries (one's link beside another's compiles).
#   kube:  etcd and kube-apiserver, kube-controller-manager, kube-scheduler
#          (etcd at the version k8s.io/kubernetes itself requires);
#   tools: promtool, helm and kwok (all three on k8s.io/* v0.37: helm's and
#          promtool's own, one minor above kwok's).

# go_module DIR GOMOD-BODY IMPORT... writes a throwaway module (go.mod, and a
# tools.go importing the commands) and tidies it.
go_module() {
	local dir=$1 body=$2
	shift 2
	rm -rf "$dir"
	mkdir -p "$dir"
	printf '%s\n' "$body" >"$dir/go.mod"
	{
		printf '//go:build tools\n\npackage tools\n\nimport (\n'
		local imp
		for imp in "$@"; do printf '\t_ "%s"\n' "$imp"; done
		printf ')\n'
	} >"$dir/tools.go"
	(cd "$dir" && GOFLAGS=-mod=mod go mod tidy >&2) || die "go mod tidy failed in $dir"
}

# mod_download MODULE@VERSION FIELD downloads the module (outside any
# module) and prints FIELD of go mod download -json (Dir, GoMod, ...).
mod_download() {
	mkdir -p "$CACHE/build"
	(cd "$CACHE/build" && GOFLAGS=-mod=mod go mod download -json "$1") |
		sed -n 's/^[[:space:]]*"'"$2"'": "\(.*\)",\{0,1\}$/\1/p'
}

# require_version DIR MODULE VERSION fails when the module's build does not
# use MODULE at VERSION (another module's requirement raised it).
require_version() {
	local got
	got=$(cd "$1" && go list -m -f '{{.Version}}' "$2") || die "go list -m $2 failed in $1"
	[ "$got" = "$3" ] || die "$2 resolves to $got in $1, want $3 (a pin needs updating)"
}

# go_build DIR TAGS LDFLAGS PKG=DEST... builds the PKGs of the module in DIR
# in one go build and moves each binary to DEST (go names a binary after its
# package's last path element, the one before a /vN suffix).
go_build() {
	local dir=$1 tags=$2 ldflags=$3 pkgs=() spec
	shift 3
	for spec in "$@"; do pkgs+=("${spec%%=*}"); done
	mkdir -p "$dir/bin"
	(cd "$dir" && go build -trimpath -tags "$tags" -ldflags "$ldflags" -o bin/ "${pkgs[@]}" >&2) ||
		die "building ${pkgs[*]} failed"
	local pkg dest name
	for spec in "$@"; do
		pkg=${spec%%=*} dest=${spec#*=}
		name=${pkg##*/}
		[[ $name =~ ^v[0-9]+$ ]] && { name=${pkg%/*}; name=${name##*/}; }
		mkdir -p "$(dirname "$dest")"
		mv "$dir/bin/$name" "$dest"
	done
}

# build_ldflags for kube binaries, so `--version` reports the real version.
kube_ldflags() {
	local minor=${KUBE_VERSION#v1.}
	minor=${minor%%.*}
	echo "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}

# build_kube builds the missing ones of etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler into OUT.
build_kube() {
	local out=$1 todo=() cmd
	[ -x "$out/etcd" ] || todo+=("go.etcd.io/etcd/server/v3=$out/etcd")
	for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
		[ -x "$out/$cmd" ] || todo+=("k8s.io/kubernetes/cmd/$cmd=$out/$cmd")
	done
	[ ${#todo[@]} -eq 0 ] && return 0
	log "building ${todo[*]##*/} (kube $KUBE_VERSION, etcd $ETCD_VERSION; cold on 2 cores: 25 min beside the tools build)"
	local gomod
	gomod=$(mod_download "k8s.io/kubernetes@$KUBE_VERSION" GoMod)
	[ -f "$gomod" ] || die "could not download k8s.io/kubernetes@$KUBE_VERSION go.mod"
	# k8s.io/kubernetes replaces its staging modules with ./staging/src/...,
	# which do not exist in the module zip: pin each to its published version.
	local build="$CACHE/build/kube-$KUBE_VERSION" staging m body
	staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$gomod")
	[ -n "$staging" ] || die "no staging replace directives found in $gomod"
	body="module faultline.local/testenv/kube

go 1.26

require (
	k8s.io/kubernetes $KUBE_VERSION
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
)

replace ("
	for m in $staging; do
		body+="
	$m => $m $KUBE_STAGING_VERSION"
	done
	body+="
)"
	go_module "$build" "$body" go.etcd.io/etcd/server/v3 \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
	require_version "$build" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
	go_build "$build" "" "$(kube_ldflags)" "${todo[@]}"
	rm -rf "$build"
}

# build_tools NAME... builds the missing ones of promtool, helm and kwok
# (Prometheus's promtool for deploy/monitoring's check rules / test rules;
# the helm CLI for the chart's lint, template and install; kwok for the
# test clusters' nodes). The remove_all_sd tag (Prometheus's plugins/)
# leaves out the service-discovery SDKs, which promtool's rule commands
# never use.
build_tools() {
	local todo=() t
	for t in "$@"; do
		case $t in
		promtool) [ -x "$CACHE/promtool/$PROMTOOL_VERSION/promtool" ] ||
			todo+=("github.com/prometheus/prometheus/cmd/promtool=$CACHE/promtool/$PROMTOOL_VERSION/promtool") ;;
		helm) [ -x "$CACHE/helm/$HELM_VERSION/helm" ] ||
			todo+=("helm.sh/helm/v4/cmd/helm=$CACHE/helm/$HELM_VERSION/helm") ;;
		kwok) [ -x "$CACHE/kube/$KUBE_VERSION/kwok" ] ||
			todo+=("sigs.k8s.io/kwok/cmd/kwok=$CACHE/kube/$KUBE_VERSION/kwok") ;;
		esac
	done
	[ ${#todo[@]} -eq 0 ] && return 0
	command -v go >/dev/null || die "go is not on PATH"
	log "building ${todo[*]##*/} (promtool $PROMTOOL_VERSION, helm $HELM_VERSION, kwok $KWOK_VERSION; cold on 2 cores: 20 min beside the kube build)"
	local build="$CACHE/build/tools"
	go_module "$build" "module faultline.local/testenv/tools

go 1.26

require (
	github.com/prometheus/prometheus $PROMTOOL_VERSION
	helm.sh/helm/v4 $HELM_VERSION
	sigs.k8s.io/kwok $KWOK_VERSION
)" github.com/prometheus/prometheus/cmd/promtool helm.sh/helm/v4/cmd/helm sigs.k8s.io/kwok/cmd/kwok
	require_version "$build" github.com/prometheus/prometheus "$PROMTOOL_VERSION"
	require_version "$build" helm.sh/helm/v4 "$HELM_VERSION"
	require_version "$build" sigs.k8s.io/kwok "$KWOK_VERSION"
	go_build "$build" remove_all_sd "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "${todo[@]}"
	rm -rf "$build"
}

# kwok_stages copies kwok's stage files (from its module) into OUT/stages.
kwok_stages() {
	local out=$1
	if [ ! -f "$out/stages/.complete" ]; then
		local moddir
		moddir=$(mod_download "sigs.k8s.io/kwok@$KWOK_VERSION" Dir)
		[ -d "$moddir/kustomize/stage" ] || die "kwok module has no kustomize/stage ($moddir)"
		rm -rf "$out/stages"
		mkdir -p "$out/stages"
		# The "fast" node and pod lifecycles (no delays, no init containers)
		# plus the node heartbeat: nodes become Ready, pods Running, and
		# deleted (evicted) pods really go away.
		local f
		for f in node/fast/node-initialize node/heartbeat/node-heartbeat \
			pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
			[ -f "$moddir/kustomize/stage/$f.yaml" ] || die "kwok stage $f.yaml not found under $moddir/kustomize/stage"
			cp "$moddir/kustomize/stage/$f.yaml" "$out/stages/${f##*/}.yaml"
			chmod 0644 "$out/stages/${f##*/}.yaml"
		done
		touch "$out/stages/.complete"
	fi
}

install_kube() {
	local out="$CACHE/kube/$KUBE_VERSION"
	mkdir -p "$out" "$CACHE/build"
	command -v go >/dev/null || die "go is not on PATH"
	build_kube "$out"
	with_lock tools build_tools kwok
	kwok_stages "$out"
	echo "testenv: kube $KUBE_VERSION (etcd $ETCD_VERSION, kwok $KWOK_VERSION) $out"
}

# install_tools NAME... builds the missing ones of promtool, helm and kwok
# and prints promtool's and helm's lines (kwok's is the kube line).
install_tools() {
	with_lock tools build_tools "$@"
	local t
	for t in "$@"; do
		case $t in
		promtool) echo "testenv: promtool $PROMTOOL_VERSION $CACHE/promtool/$PROMTOOL_VERSION/promtool" ;;
		helm) echo "testenv: helm $HELM_VERSION $CACHE/helm/$HELM_VERSION/helm" ;;
		esac
	done
}

# ---------------------------------------------------------------------- main

# install_all installs every component in three streams side by side: the
# downloads (apt, Maven, PyPI: mostly waiting on the network and the disk),
# the Kubernetes build (etcd, the kube binaries), and the tools build
# (promtool, helm, kwok; the kube stream waits for its kwok). On 2 cores the two
# Go build streams fill each other's idle time (go mod tidy's downloads,
# single-threaded links), and the downloads cost almost nothing beside them.
# Each stream runs its components in order; apt's lock keeps clickhouse and
# chromium in the same one. Fails when any stream fails, after all finish.
install_all() {
	local pids=() names=() i rc=0
	(
		with_lock clickhouse install_clickhouse
		with_lock kafka install_kafka
		with_lock zookeeper install_zookeeper
		with_lock chdb install_chdb
		with_lock sushy install_sushy
		with_lock moto install_moto
		with_lock chromium install_chromium
	) &
	pids+=($!) names+=(downloads)
	with_lock kube install_kube &
	pids+=($!) names+=(kube)
	install_tools promtool helm kwok &
	pids+=($!) names+=("promtool, helm and kwok")
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" || { log "error: the ${names[$i]} stream failed (its error is above)"; rc=1; }
	done
	return $rc
}

main() {
	local targets=("$@")
	[ ${#targets[@]} -eq 0 ] && targets=(all)
	local t
	for t in "${targets[@]}"; do
		case $t in
		clickhouse) with_lock clickhouse install_clickhouse ;;
		kafka) with_lock kafka install_kafka ;;
		kube) with_lock kube install_kube ;;
		zookeeper) with_lock zookeeper install_zookeeper ;;
		chdb) with_lock chdb install_chdb ;;
		sushy) with_lock sushy install_sushy ;;
		moto) with_lock moto install_moto ;;
		helm) install_tools helm ;;
		promtool) install_tools promtool ;;
		chromium) with_lock chromium install_chromium ;;
		all) install_all ;;
		*) die "unknown component '$t' (want kafka, clickhouse, zookeeper, chdb, sushy, moto, promtool, chromium, kube, helm or all)" ;;
		esac
	done
}

main "$@"
exit $?
