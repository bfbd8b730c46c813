# Handoff — the two commands a newcomer runs: `make demo` and `make test`.
# Each target sets up what it needs (idempotently) into .venv/ and the cache dir
# ($HANDOFF_CACHE, default ~/.cache/handoff).
SHELL := /bin/bash
# Python 3.11 where there is one (Debian 12's python3, the image's), else the distribution's python3 (3.13 on
# Debian 13, whose archive has no 3.11); hack/install-system-deps.sh installs it when missing.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
TESTBED := hack/testbed
PYTEST_ARGS ?=

.PHONY: demo test venv testbed-build image crds check-crds unit bench clean

$(VENV)/.installed: pyproject.toml setup.py $(wildcard spark_app/handoff_spark/*/*.c) requirements.lock \
                   $(shell find spark_app/jvm -name '*.java') spark_app/handoff_spark/startup/local_fs.py
	@# Python with venv and headers; setup.py's C extensions (the native Kafka reader, the JSON decoder) need gcc
	@# and librdkafka's headers. Quick when everything is there.
	@PYTHON=$(PYTHON) bash hack/install-system-deps.sh demo
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	@# pyspark has no wheel on PyPI: its wheel is built once into the cache (handoff_testbed.sdist_wheels), else uv
	@# built it again at every install and kept each build (2.8 GB a fresh venv) in its cache.
	$(VENV)/bin/pip install -q uv==0.13.9
	wheels=$$(PYTHONPATH=hack $(PY) -m handoff_testbed.sdist_wheels) && \
	  $(VENV)/bin/uv pip install -q --python $(PY) --find-links "$$wheels" -r requirements.lock
	@# Rebuilt every time (uv would reuse its cached build of the editable package, C extension included).
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps --reinstall-package handoff-operator \
	  --refresh-package handoff-operator -e .
	@# Spark puts $$SPARK_HOME/python/lib/pyspark.zip and py4j's source zip first on every Python worker's path;
	@# from a zip, Python compiles their modules again in every fresh interpreter (pyspark ~0.25 s, py4j ~0.09 s
	@# each: a query's start, a session's first batch). The same pyspark and py4j are installed beside them
	@# (compiled by the step below); without the zips the workers import those.
	rm -f $(VENV)/lib/python3*/site-packages/pyspark/python/lib/pyspark.zip \
	  $(VENV)/lib/python3*/site-packages/pyspark/python/lib/py4j-*-src.zip
	@# Hadoop's file: system without a chmod process per checkpoint file (handoff_spark.startup.local_fs), into
	@# Spark's jars (javac: a JDK, hack/install-system-deps.sh); before the mtimes are pinned.
	$(PY) -m handoff_spark.startup.local_fs build >/dev/null
	@# One fixed mtime for Spark's jars: a new venv at the same path (a CI checkout) can then use the JVM
	@# class-data archive the last one built (handoff_spark.startup.jvm_cds).
	$(PY) -m handoff_spark.startup.jvm_cds --pin-jar-mtimes
	@touch $@

## Bytecode for everything the venv holds, written once, as pip (and so the image) does at install: uv writes
## none, and where PYTHONDONTWRITEBYTECODE is set nothing caches it later, so every fresh interpreter compiled
## its imports from source again. Spark starts one for each query's source planner (its imports: 0.45 s of
## CPU from source, 0.17 s from bytecode) and for every Python daemon of a session (docs/benchmarks.md,
## "Throughput"). A separate step so an existing venv gets it without a reinstall.
$(VENV)/.compiled: $(VENV)/.installed
	$(PY) -m compileall -q -j 0 $(VENV)/lib/python3*/site-packages spark_app operator
	@touch $@

venv: $(VENV)/.compiled

## Everything the tests start: Kafka jars, kube-apiserver/etcd builds, PostgreSQL, BigQuery emulator venv,
## the real node (kubelet, kube-proxy, pause image) and the project's image it runs. All cached.
testbed-build: venv
	PYTHON=$(PYTHON) bash hack/install-system-deps.sh test
	$(TESTBED) build kafka apiserver postgres s3 gcs bigquery node schema-registry
	@# hadoop-aws and the AWS SDK modules (hack/hadoop-aws/pom.xml) for the drivers whose checkpoint is on S3, Google's
	@# GCS connector (hack/gcs-connector/pom.xml) for those on Google Cloud Storage.
	PYTHONPATH=hack $(PY) -m handoff_testbed.jars
	@# A class-data-sharing archive of Spark's classes for this machine's JDK and Spark (handoff_spark.startup.jvm_cds, ~30 s
	@# once, kept in the cache): every local driver the tests start maps them instead of loading thousands of classes
	@# again (a local session's start, 7.6-8.7 s -> 4.5-4.9 s here under the tests' JVM options). Each venv makes its own
	@# (~170 MB); the step removes other installs' archives but the 3 most recently used (jvm_cds.prune).
	$(PY) -m handoff_spark.startup.jvm_cds --if-missing

## The project's image (Dockerfile) built here on a debootstrapped Debian base; a no-op when the inputs
## are unchanged (cached by their hash). Prints the image reference.
image: venv
	PYTHON=$(PYTHON) bash hack/install-system-deps.sh test
	PYTHONPATH=hack $(PY) -m handoff_testbed.image

crds: venv
	$(PY) -m handoff_operator.crd.generate

check-crds: venv
	$(PY) -m handoff_operator.crd.generate --check

## Three pytest-xdist workers (tests/conftest.py: each starts its own test bed; the real node's tests share one):
## the tests wait on Kafka, Spark and the API server, so two workers left the two cores idle ~15 % of the time
## and three keep them busy (docs/test-suite.md). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 3
test: testbed-build check-crds
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest -m "not e2e" tests/unit $(PYTEST_ARGS)

## Installs only what the demo uses (hack/install-system-deps.sh demo): Python, gcc, librdkafka's headers, Java 17
## and Maven; nothing of the tests' (Docker, containerd, PostgreSQL, Go, kubectl ...).
demo: venv
	PYTHON=$(PYTHON) bash hack/install-system-deps.sh demo
	$(TESTBED) build kafka
	$(PY) hack/demo.py

bench: testbed-build
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .testbed .test-logs
