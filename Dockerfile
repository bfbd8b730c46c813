# One image for the Handoff operator and the Spark driver/executors it runs.
#   docker build -t handoff:0.1.0 .
# Operator: `handoff operator` (the chart's args); driver: `python -m handoff_spark run --config ...`
# (the operator sets the command); executors: `executor` (Spark's Kubernetes backend), see
# docker/entrypoint.sh.
#
# bookworm, not the moving `3.11-slim` tag: Debian 13 has no OpenJDK 17, and Spark 4 needs Java 17+.
# BASE: any Debian bookworm image. Where no container registry is reachable, `make image` builds one
# from Debian packages (debootstrap, then `docker import`) and passes it here; it has no Python yet,
# so the step below installs Debian's python3.11 when the base lacks a python3.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ARG DEBIAN_FRONTEND=noninteractive
RUN python_pkgs=; command -v python3 >/dev/null || python_pkgs="python3 python3-venv" \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps $python_pkgs \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /opt/java \
 && python3 -m venv /opt/venv

# A virtualenv, so the same steps work on both bases (Debian's own python refuses `pip install` into
# the system, PEP 668).
ENV PATH=/opt/venv/bin:$PATH \
    JAVA_HOME=/opt/java \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3

WORKDIR /opt/handoff

# Dependencies first (own layer, rebuilt only when the pins change): the runtime dependencies named in
# pyproject.toml at exactly the versions of requirements.lock. Not `-r requirements.lock` itself: the
# lock also pins the test tools (pytest, moto, helm-python-sdk ...), which do not belong in the image.
# PIP_OPTIONS: extra pip arguments, e.g. a local wheelhouse where PyPI is not reachable from the build
# (`make image` passes `--no-index --find-links http://127.0.0.1:PORT/` with the build on the host network).
ARG PIP_OPTIONS=""
COPY pyproject.toml requirements.lock ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/runtime-requirements.txt \
 && pip install $PIP_OPTIONS --constraint requirements.lock --requirement /tmp/runtime-requirements.txt \
 && rm /tmp/runtime-requirements.txt

# Spark puts $SPARK_HOME/python/lib/pyspark.zip and py4j's source zip first on every Python worker's path; from a
# zip, Python compiles their modules again in every fresh interpreter (pyspark ~0.25 s, py4j ~0.09 s each: a query's
# start, a session's first batch). pip installed the same pyspark and py4j, compiled, beside them; without the zips
# the workers import those (docs/benchmarks.md).
RUN rm -f /opt/venv/lib/python3*/site-packages/pyspark/python/lib/pyspark.zip \
          /opt/venv/lib/python3*/site-packages/pyspark/python/lib/py4j-*-src.zip

# The S3A connector, for checkpoints on S3 (spec.checkpoint.location s3a://...): hadoop-aws 3.5.0 (the Hadoop pyspark
# bundles) and the AWS SDK v2 modules it uses, 35 jars, 13 MB, the pinned list with sha256s in docker/hadoop-aws-jars.txt
# (from hack/hadoop-aws/pom.xml), into pyspark's own jars: the driver and the executors load them with Spark's.
# MAVEN_REPO: where the build reaches Maven Central or a mirror of it (`make image` serves the test bed's copy).
ARG MAVEN_REPO=https://repo1.maven.org/maven2
# Google's GCS connector, for checkpoints on Google Cloud Storage (gs://...): its shaded jar, 37 MB, pinned with its
# sha256 in docker/gcs-connector-jars.txt (from hack/gcs-connector/pom.xml).
COPY docker/fetch_jars.py docker/hadoop-aws-jars.txt docker/gcs-connector-jars.txt /tmp/jars/
RUN jars="$(python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" \
 && python /tmp/jars/fetch_jars.py "$MAVEN_REPO" /tmp/jars/hadoop-aws-jars.txt "$jars" \
 && python /tmp/jars/fetch_jars.py "$MAVEN_REPO" /tmp/jars/gcs-connector-jars.txt "$jars" \
 && rm -rf /tmp/jars

# Hadoop's file: system without a chmod process per file it writes (handoff_spark/startup/local_fs.py: a checkpoint on
# the driver's volume, the default, writes its logs and state through it), compiled into pyspark's jars before the
# archive below records their class path; the JDK leaves again in the same layer.
COPY spark_app/jvm /tmp/localfs/jvm
COPY spark_app/handoff_spark/startup/local_fs.py /tmp/localfs/handoff_spark/startup/
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && python /tmp/localfs/handoff_spark/startup/local_fs.py build \
      "$(python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" \
 && apt-get purge -y --auto-remove openjdk-17-jdk-headless && apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/localfs \
 && java -version 2>&1 | head -1

# A class-data-sharing archive of Spark's classes (handoff_spark/startup/jvm_cds.py): a driver or executor JVM maps
# them from one file instead of loading and verifying them from the jars again at every (re)start. It is valid only
# for this JDK and these jars (the step above), so it is made here, from a local session that runs the classes a
# driver loads; only the four files it needs are copied, so a code change does not rebuild it. +~170 MB.
# `<archive>.classpath` records the class path it was made with, which the executors' entry point starts with.
COPY spark_app/handoff_spark/__init__.py spark_app/handoff_spark/pyspark_private.py \
     spark_app/handoff_spark/private_api.py /tmp/cds/handoff_spark/
COPY spark_app/handoff_spark/startup/jvm_cds.py /tmp/cds/handoff_spark/startup/
RUN python /tmp/cds/handoff_spark/startup/jvm_cds.py /opt/handoff/spark-cds.jsa \
 && chmod a+r /opt/handoff/spark-cds.jsa /opt/handoff/spark-cds.jsa.classpath \
 && rm -rf /tmp/cds /tmp/spark-* /tmp/blockmgr-* /tmp/handoff-cds-* /root/.ivy2*
ENV HANDOFF_SPARK_CDS_ARCHIVE=/opt/handoff/spark-cds.jsa

COPY operator ./operator
COPY spark_app ./spark_app
COPY setup.py ./
# setup.py's C extensions are compiled here: the range readers' native Kafka fetch (_kafka_native.c) against
# Debian's librdkafka headers (it binds to confluent-kafka's bundled librdkafka at run time, so no librdkafka package
# stays in the image), and the JSON decoder (_json_arrow.c, plain C); the compiler and headers leave again in the
# same layer. Python's own headers: the python base has them, Debian's python3 needs python3-dev.
RUN build_pkgs="gcc libc6-dev librdkafka-dev" \
 && { python3 -c "import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
      || build_pkgs="$build_pkgs python3-dev"; } \
 && apt-get update && apt-get install -y --no-install-recommends $build_pkgs \
 && pip install $PIP_OPTIONS --no-deps . && rm -rf build ./*.egg-info \
 && apt-get purge -y --auto-remove $build_pkgs && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && python -c "import handoff_spark.decode._json_arrow; from handoff_spark.kafka import native; assert native.load_error() is None, native.load_error()"

# The fork server's launcher (handoff_spark/startup/fork_server.py): a driver pod makes it Spark's Python, so the
# planners, source and commit runners its JVM starts are forks of a server that imported pyspark and the sink while
# the JVM launched; the executor pods run the same file, which there (no HANDOFF_FORK_SOCKET) is the real python.
RUN python -m handoff_spark.startup.fork_server --install-launcher /opt/handoff/bin/fork-python
ENV HANDOFF_FORK_LAUNCHER=/opt/handoff/bin/fork-python

COPY docker/entrypoint.sh /usr/local/bin/handoff-entrypoint

# 185: the uid Spark's own images use; the chart's securityContext runs as it.
RUN useradd --uid 185 --gid 0 --home-dir /opt/handoff --no-create-home --shell /usr/sbin/nologin spark
USER 185

ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/handoff-entrypoint"]
CMD ["--help"]
