"""What exists only to make a (re)start faster, apart from the data path: the driver's bootstrap batches
(`bootstrap`), the session's warm-up query (`session_warmup`), warming a new executor (`executor_warmup`), the
JVM's class-data-sharing archive (`jvm_cds`) and the pre-importing Python worker daemon (`worker_daemon`). Each
sits behind one switch; turned off, the stream behaves the same, only slower to start.

May import the data-path folders, the top-level modules (`switches` for its switch) and `driver.temp_dirs`. Imported
by `driver` only (and by Spark, which runs `worker_daemon`).
"""
