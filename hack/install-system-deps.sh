#!/usr/bin/env bash
# Debian packages the test bed needs, installed only when missing (idempotent, quiet when present).
# Java 17 + Maven run Kafka from its Maven Central jars; Go builds kube-apiserver/etcd;
# PostgreSQL backs the durable Iceberg catalog.
set -euo pipefail
need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || need+=(postgresql)
command -v kubectl >/dev/null || need+=(kubectl)
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || need+=(golang)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
