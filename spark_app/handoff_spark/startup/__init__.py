"""What exists only to make a (re)start of Spark's query faster, apart from the data path (every batch is
committed by Spark's query; nothing here writes): the session launched while the driver prepares
(`early_session`), the session's warm-up query ahead of the first batch (`session_warmup`), warming a new executor
(`executor_warmup`), the JVM's class-data-sharing archive (`jvm_cds`), the pre-importing Python worker daemon
(`worker_daemon`) and the fork server Spark's Python processes are forked from (`fork_server`, with its launcher
`fork_client`). Turned off (each warm-up has a switch), the stream behaves the same, only slower to start.

May import: `config`, `switches`, `faults`, `pyspark_private`, `checkpoint`, `kafka`, `sink`, `iceberg` (the
data path it warms) and `driver.temp_dirs` (the warm-ups' own checkpoints).
Imported by `driver` only (and by Spark, which runs `worker_daemon`; and by the driver's fork server process).
"""
