#!/usr/bin/env bash
# Debian packages the test bed needs, installed only when missing (idempotent, quiet when present).
# Java 17 + Maven run Kafka from its Maven Central jars; Go builds kube-apiserver/etcd;
# PostgreSQL backs the durable Iceberg catalog. The real test-bed node and `make image`: Docker's engine
# (builds the image), debootstrap (its base, from the Debian mirror), containerd + runc + CNI plugins (the
# node), gcc (the pause image, the native Kafka reader), iptables (CNI, kube-proxy).
set -euo pipefail
need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || need+=(postgresql)
command -v kubectl >/dev/null || need+=(kubectl)
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || need+=(golang)
[ -x /usr/sbin/dockerd ] || command -v dockerd >/dev/null || need+=(docker.io)
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v containerd >/dev/null || need+=(containerd)
[ -x /usr/sbin/runc ] || command -v runc >/dev/null || need+=(runc)
command -v gcc >/dev/null || need+=(gcc)
# The native Kafka reader's headers (setup.py; the extension binds to confluent-kafka's own librdkafka).
[ -f /usr/include/librdkafka/rdkafka.h ] || need+=(librdkafka-dev)
[ -x /usr/sbin/iptables ] || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
