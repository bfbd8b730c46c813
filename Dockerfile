# One image for the Handoff operator and the Spark driver/executors it runs.
#   docker build -t handoff:0.1.0 .
# Operator: `handoff operator` (the chart's args); driver: `python -m handoff_spark run --config ...`
# (the operator sets the command); executors: `executor` (Spark's Kubernetes backend), see
# docker/entrypoint.sh.
#
# bookworm, not the moving `3.11-slim` tag: Debian 13 has no OpenJDK 17, and Spark 4 needs Java 17+.
FROM python:3.11-slim-bookworm

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /opt/java

ENV JAVA_HOME=/opt/java \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3

WORKDIR /opt/handoff

# Dependencies first (own layer, rebuilt only when the pins change): the runtime dependencies named in
# pyproject.toml at exactly the versions of requirements.lock. Not `-r requirements.lock` itself: the
# lock also pins the test tools (pytest, moto, helm-python-sdk ...), which do not belong in the image.
COPY pyproject.toml requirements.lock ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/runtime-requirements.txt \
 && pip install --constraint requirements.lock --requirement /tmp/runtime-requirements.txt \
 && rm /tmp/runtime-requirements.txt

COPY operator ./operator
COPY spark_app ./spark_app
RUN pip install --no-deps . && rm -rf build ./*.egg-info

COPY docker/entrypoint.sh /usr/local/bin/handoff-entrypoint

# 185: the uid Spark's own images use; the chart's securityContext runs as it.
RUN useradd --uid 185 --gid 0 --home-dir /opt/handoff --no-create-home --shell /usr/sbin/nologin spark
USER 185

ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/handoff-entrypoint"]
CMD ["--help"]
