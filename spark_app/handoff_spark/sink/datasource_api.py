"""PySpark's Python data source classes the sinks subclass, or `object` stand-ins where pyspark is absent.

Why: the operator imports the sinks' pure pieces (schema plans, ledger readers) without pyspark installed;
one place decides what the sinks' base classes are then.
"""
from __future__ import annotations

try:
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                        WriterCommitMessage)
except ImportError:  # the operator imports pieces of this package without pyspark
    DataSource = object  # type: ignore[misc,assignment]
    DataSourceArrowWriter = object  # type: ignore[misc,assignment]
    DataSourceStreamArrowWriter = object  # type: ignore[misc,assignment]
    WriterCommitMessage = object  # type: ignore[misc,assignment]

__all__ = ["DataSource", "DataSourceArrowWriter", "DataSourceStreamArrowWriter", "WriterCommitMessage"]
