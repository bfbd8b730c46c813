"""What Spark's planner interpreters import when they unpickle Handoff's data sources.

Spark pickles a Python data source class (and the stream writer) by reference; the fresh interpreters that
plan a query (`pyspark.sql.worker.create_data_source`, `write_into_data_source`) import its module to unpickle
it, on the critical path of every (re)started driver's first batch. The Iceberg sink's classes must therefore
come from a module that does not import PyIceberg, SQLAlchemy, pydantic or pyarrow (≈4 s of CPU per
interpreter on the test machine; docs/benchmarks.md, "Cold start"). Each check runs in a fresh interpreter.
"""
from __future__ import annotations

import pickle
import subprocess
import sys

from pyspark import cloudpickle

from handoff_spark.sink import registry as sinks
from handoff_spark.iceberg import stream as iceberg_stream

HEAVY = ("pyarrow", "pyiceberg", "sqlalchemy", "pydantic", "handoff_spark.iceberg.sink", "handoff_spark.config")


def modules_after_unpickling(payload: bytes) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after importing what a planner worker imports and unpickling
    `payload`."""
    code = ("import pickle, sys; import pyspark.sql.worker.write_into_data_source; "
            f"obj = pickle.loads({payload!r}); "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return [m for m in run.stdout.strip().split(",") if m]


def test_the_iceberg_data_source_class_unpickles_without_the_sinks_machinery():
    cls = sinks.get("iceberg").data_source
    assert cls is iceberg_stream.IcebergSinkDataSource and cls.name() == "handoff-iceberg"
    assert modules_after_unpickling(cloudpickle.dumps(cls)) == []


def test_the_iceberg_stream_writer_unpickles_without_the_sinks_machinery():
    writer = iceberg_stream.IcebergSinkDataSource(options={"config": "{}"}).streamWriter(None, False)
    payload = cloudpickle.dumps(writer)
    assert modules_after_unpickling(payload) == []
    back = pickle.loads(payload)
    assert type(back) is iceberg_stream.IcebergStreamWriter and back.config_json == "{}"


def test_the_session_warmups_classes_unpickle_without_the_sinks_machinery():
    """The session warm-up (handoff_spark.startup.session_warmup) runs beside every running stream's first batch: its
    sink and writer are unpickled in the same fresh planner interpreters and must stay as light."""
    from handoff_spark.startup import session_warmup

    source = session_warmup.SessionWarmUpDataSource(options={"config": "{}"})
    writer = source.streamWriter(None, False)
    for obj in (session_warmup.SessionWarmUpDataSource, writer):
        assert modules_after_unpickling(cloudpickle.dumps(obj)) == []
