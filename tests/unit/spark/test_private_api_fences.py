"""The private-API fences (one module per library: `pyspark_private`, `confluent_kafka_private`,
`iceberg.pyiceberg_private`) against the installed libraries: every private name a fence lists still resolves, every
accessor works on real objects, and the code uses private names of these libraries nowhere else. When an upgrade
moves one, these fail naming it (`PrivateApiMissing`), instead of a batch failing later with an AttributeError."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from handoff_spark import private_api, pyspark_private
from handoff_spark.kafka import confluent_kafka_private
from handoff_spark.iceberg import pyiceberg_private

REPO = Path(__file__).resolve().parents[3]
FENCES = {"pyspark": pyspark_private, "confluent_kafka": confluent_kafka_private, "pyiceberg": pyiceberg_private}


def _unresolved_message(module: Any) -> str:
    missing = private_api.unresolved(module.PRIVATE_APIS)
    return "; ".join(str(private_api.PrivateApiMissing(api, module.__name__)) for api in missing)


def test_a_moved_private_api_fails_naming_it():
    """What the fences' failures look like: the API's name, the installed version, and where to port it."""
    assert private_api.unresolved(["pyspark.SparkContext._jvm", "pyspark.SparkContext._no_such_api",
                                   "pyspark.no_such_module.thing"]) == ["pyspark.SparkContext._no_such_api",
                                                                        "pyspark.no_such_module.thing"]
    with pytest.raises(private_api.PrivateApiMissing) as e:
        private_api.attribute(object(), "_gone", api="pyspark.SparkContext._gone", fence="the fence")
    assert str(e.value).startswith("pyspark.SparkContext._gone is gone in the installed pyspark 4.")
    assert "the fence" in str(e.value)


def test_pyspark_fence_names_resolve():
    assert private_api.unresolved(pyspark_private.PRIVATE_APIS) == [], _unresolved_message(pyspark_private)


def test_pyspark_process_modules_exist():
    """The fork server preloads them by name: a PySpark that moved one would leave it to each process again."""
    import importlib.util

    assert [m for m in pyspark_private.PROCESS_MODULES if importlib.util.find_spec(m) is None] == []


def test_confluent_kafka_fence_names_resolve_and_find_its_librdkafka():
    assert private_api.unresolved(confluent_kafka_private.PRIVATE_APIS) == [], \
        _unresolved_message(confluent_kafka_private)
    from confluent_kafka import KafkaError

    # The codes librdkafka's consumer reports: distinct, negative (local), and what the reader compares with.
    assert confluent_kafka_private.PARTITION_EOF == KafkaError._PARTITION_EOF  # noqa: SLF001
    assert confluent_kafka_private.PARTITION_EOF < 0 and confluent_kafka_private.AUTO_OFFSET_RESET < 0
    assert confluent_kafka_private.PARTITION_EOF != confluent_kafka_private.AUTO_OFFSET_RESET
    path = confluent_kafka_private.librdkafka_path()
    assert os.path.isfile(path) and "librdkafka" in os.path.basename(path)


def test_pyiceberg_fence_names_resolve_and_its_instance_attributes_exist(tmp_path):
    assert private_api.unresolved(pyiceberg_private.PRIVATE_APIS) == [], _unresolved_message(pyiceberg_private)
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.io.pyarrow import ParquetFormatWriter

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", pa.schema([("id", pa.int64())]))
    base, updates = pyiceberg_private.transaction_state(table.transaction())
    assert base is table.metadata and updates == ()
    writer = ParquetFormatWriter(None, None, {})  # type: ignore[arg-type]
    # parquet_writer._Writer reads and replaces these before the first write opens the file.
    assert writer._writer is None and isinstance(writer._parquet_writer_kwargs, dict)  # noqa: SLF001


def test_pyspark_fence_accessors_work_on_a_real_session(spark):
    sc = spark.sparkContext
    assert pyspark_private.jvm(sc).java.lang.Integer.valueOf(7) == 7
    assert list(pyspark_private.jvm(sc).scala.jdk.javaapi.CollectionConverters.asJava(
        pyspark_private.scala_context(sc).getExecutorIds())) == []  # local mode: the driver only
    assert pyspark_private.java_session(spark).version() == spark.version
    pyspark_private.set_active_session(spark)
    assert pyspark_private.gateway_process(sc).poll() is None  # the driver JVM, running
    assert (Path(pyspark_private.spark_home()) / "jars").is_dir()
    assert callable(pyspark_private.daemon_manager())
    assert pyspark_private.plan_deterministic(spark.range(3).selectExpr("id * 2 AS x"))
    assert not pyspark_private.plan_deterministic(spark.range(3).selectExpr("id + rand() AS x"))


def test_watermark_output_operators_finds_what_waits_on_a_streams_watermark(spark):
    """Only streaming state whose output waits on the watermark counts (driver.app.no_data_batches): a dedupe within
    the watermark, a filter or a join with a static lookup do not; an aggregation, a DISTINCT, dropDuplicates and a
    stream joined with itself do; a static aggregation does not."""
    find = pyspark_private.watermark_output_operators
    spark.readStream.format("rate").load().createOrReplaceTempView("src")
    spark.range(5).withColumnRenamed("id", "k").createOrReplaceTempView("lookup")
    assert find(spark.sql("SELECT value, timestamp FROM src WHERE value > 3")) == []
    assert find(spark.sql("SELECT * FROM src").withWatermark("timestamp", "1 hour")
                .dropDuplicatesWithinWatermark(["value"])) == []
    assert find(spark.sql("SELECT s.*, l.k FROM src s JOIN lookup l ON s.value = l.k")) == []
    assert find(spark.sql("SELECT value, count(*) AS n FROM src GROUP BY value")) == ["Aggregate"]
    assert find(spark.sql("SELECT DISTINCT value FROM src")) == ["Distinct"]
    assert find(spark.sql("SELECT * FROM src").dropDuplicates(["value"])) == ["Deduplicate"]
    assert find(spark.sql("SELECT a.value FROM src a JOIN src b ON a.value = b.value")) == ["Join"]
    assert find(spark.sql("SELECT k, count(*) FROM lookup GROUP BY k")) == []


# What a private name of these libraries looks like in code: `from lib... import _x`, or `._x` read off an object
# the line got from one of them. Only the fences may have them (subclass overrides are listed in their fence).
_PRIVATE_IMPORT = re.compile(r"^\s*from (pyspark|confluent_kafka|pyiceberg|kopf|kubernetes|pyarrow|google)[\w.]* "
                             r"import .*\b_[a-zA-Z]", re.M)
_PRIVATE_ATTR = re.compile(r"\b(sc|sparkContext|spark|SparkSession|SparkContext|KafkaError|Consumer|Producer|kopf|"
                           r"pa|pq|pc|pj)\._[a-zA-Z]")


def test_no_private_api_outside_the_fences():
    fences = {Path(m.__file__).resolve() for m in FENCES.values()}
    found = []
    for path in sorted((REPO / "spark_app").rglob("*.py")) + sorted((REPO / "operator").rglob("*.py")):
        if path.resolve() in fences:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(REPO)}: {m.group(0).strip()}" for m in _PRIVATE_IMPORT.finditer(text)]
        found += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in _PRIVATE_ATTR.finditer(text)]
    assert found == [], "private library APIs outside their fence module (move them into it): " + "; ".join(found)

