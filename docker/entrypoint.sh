#!/usr/bin/env bash
# Entry point of the Handoff image, which runs three things:
#   - the operator:        `handoff operator ...`            (the chart passes `operator` as args)
#   - the Spark driver:    `python -m handoff_spark run ...` (the operator sets it as the pod's command,
#                                                              which bypasses this script)
#   - Spark executors:     started by the driver's Kubernetes backend with the single argument
#                          `executor` and their settings in SPARK_* environment variables.
# Why a script and not just `handoff`: Spark on Kubernetes assumes the image's entrypoint knows the
# `executor` command (as the one in Spark's own images does). Everything else goes to the handoff CLI.
set -euo pipefail

if [[ "${1:-}" == "executor" ]]; then
  shift
  : "${SPARK_HOME:=$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
  # JVM options arrive as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... and must keep that order.
  java_opts=()
  while IFS= read -r opt; do
    java_opts+=("$opt")
  done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//' || true)
  # The class path starts as the image's class-data archive was made (its `.classpath`, spark-submit's order), so
  # the JVM maps Spark's classes from the archive (HANDOFF_SPARK_CDS_ARCHIVE; the driver passes it in the JVM
  # options); the JVM uses an archive only when its class path begins with the archive's. The conf directory holds
  # no classes and none of its files is in a jar, so it can come after them. Extra jars (SPARK_CLASSPATH) must stay
  # first to take precedence, so with them the archive is not used.
  recorded="${HANDOFF_SPARK_CDS_ARCHIVE:-}.classpath"
  if [[ -z "${SPARK_CLASSPATH:-}" && -r "${recorded}" ]]; then
    classpath="$(<"${recorded}")"
    [[ -n "${SPARK_CONF_DIR:-}" ]] && classpath="${classpath}:${SPARK_CONF_DIR}"
  else
    classpath="${SPARK_HOME}/jars/*"
    [[ -n "${SPARK_CLASSPATH:-}" ]] && classpath="${SPARK_CLASSPATH}:${classpath}"
    [[ -n "${SPARK_CONF_DIR:-}" ]] && classpath="${SPARK_CONF_DIR}:${classpath}"
  fi
  exec "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
    -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
    -cp "${classpath}" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "${SPARK_DRIVER_URL}" \
    --executor-id "${SPARK_EXECUTOR_ID}" \
    --cores "${SPARK_EXECUTOR_CORES}" \
    --app-id "${SPARK_APPLICATION_ID}" \
    --hostname "${SPARK_EXECUTOR_POD_IP}" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "${SPARK_EXECUTOR_POD_NAME}" \
    "$@"
fi

exec handoff "$@"
