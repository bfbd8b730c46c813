"""The one C extension (`handoff_spark._kafka_native`, the range readers' native Kafka fetch); everything else
is declared in pyproject.toml. Built against Debian's librdkafka-dev headers (hack/install-system-deps.sh, the
Dockerfile) and bound at run time to confluent-kafka's own librdkafka, so it links no librdkafka itself."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("handoff_spark._kafka_native", ["spark_app/handoff_spark/_kafka_native.c"],
                             libraries=["dl"], extra_compile_args=["-O2", "-Wall"])])
