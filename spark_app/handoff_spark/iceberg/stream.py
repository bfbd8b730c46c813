"""The `handoff-iceberg` data source and stream writer classes, apart from the sink's machinery (`iceberg.sink`).

Why a module of their own: Spark pickles these classes by reference, so every interpreter that unpickles one
imports the module it lives in. At query start that happens in fresh planner interpreters
(`pyspark.sql.worker.create_data_source`, `write_into_data_source`) that only call `name()` and `streamWriter()`;
when the classes lived in `iceberg.sink`, each of them imported PyIceberg, SQLAlchemy and pyarrow's Parquet
modules first (≈4 s of CPU per interpreter on the 2-core test machine, measured with `python -X importtime`),
on the critical path of every (re)started driver's first batch (docs/benchmarks.md, "Cold start"). Here only
pyspark's own classes are imported; the writer's methods import `iceberg.sink` when they run: in write tasks
(whose worker daemon has preloaded it) and in the commit runner.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from handoff_spark.sink.datasource_api import DataSource, DataSourceStreamArrowWriter
from handoff_spark.sink.common import ConfigOnDemand

if TYPE_CHECKING:
    import pyarrow as pa

    from handoff_spark.iceberg.sink import IcebergCommitMessage

FORMAT = "handoff-iceberg"


class IcebergStreamWriter(ConfigOnDemand, DataSourceStreamArrowWriter):  # type: ignore[misc,valid-type]
    """Write tasks (executors) write Parquet files; the commit (driver side) makes them one snapshot.

    `rows`: the DataFrame path (option `rows=true`): the tasks' input is rows Spark made (`sink.frames` and the
    transform), not Kafka records or ranges."""

    def __init__(self, config_json: str, rows: bool = False, seed_line: str | None = None) -> None:
        super().__init__(config_json)
        self.rows, self.seed_line = rows, seed_line

    def write(self, iterator: Iterator[pa.RecordBatch]) -> IcebergCommitMessage:
        from handoff_spark.iceberg.sink import write_rows_task, write_task

        if self.rows:
            return write_rows_task(self.cfg, iterator, seed_line=self.seed_line)
        return write_task(self.cfg, iterator)

    def commit(self, messages: list[IcebergCommitMessage | None], batchId: int) -> None:  # noqa: N803
        from handoff_spark.iceberg.sink import commit_batch

        commit_batch(self.cfg, [m for m in messages if m is not None], batchId, frames=self.rows)

    def abort(self, messages: list[IcebergCommitMessage | None], batchId: int) -> None:  # noqa: N803
        from handoff_spark.iceberg.sink import abort_batch

        abort_batch(self.cfg, [m for m in messages if m is not None], batchId)


class IcebergSinkDataSource(DataSource):  # type: ignore[misc,valid-type]
    """`df.writeStream.format("handoff-iceberg").option("config", AppConfig JSON)`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def streamWriter(self, schema: Any, overwrite: bool) -> IcebergStreamWriter:  # noqa: N802
        options = {k.lower(): v for k, v in self.options.items()}
        return IcebergStreamWriter(self.options["config"], rows=options.get("rows", "false") == "true",
                                   seed_line=options.get("seedline"))


DATA_SOURCE = IcebergSinkDataSource
