"""The C extensions; everything else is declared in pyproject.toml.

* `handoff_spark.kafka._kafka_native`, the range readers' native Kafka fetch: built against Debian's librdkafka-dev
  headers (hack/install-system-deps.sh, the Dockerfile) and bound at run time to confluent-kafka's own librdkafka,
  so it links no librdkafka itself.
* `handoff_spark.decode._json_arrow`, flat JSON objects straight into Arrow column buffers (decode.py's first try):
  plain C, no library."""
from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall"]
setup(ext_modules=[Extension("handoff_spark.kafka._kafka_native", ["spark_app/handoff_spark/kafka/_kafka_native.c"],
                             libraries=["dl"], extra_compile_args=FLAGS),
                   Extension("handoff_spark.decode._json_arrow", ["spark_app/handoff_spark/decode/_json_arrow.c"],
                             extra_compile_args=FLAGS)])
