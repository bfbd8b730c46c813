"""The driver: the Structured Streaming query and its life (`app`), where it resumes (`resume`, the ledger over
the checkpoint, whose layout is the top-level `checkpoint`), per-batch progress and its publication to the
operator (`progress`, `publisher`), the live executor scaler (`executor_scaler`) and the driver's temp dirs
(`temp_dirs`).

May import: `config`, `contract`, `switches`, `errors`, `faults`, `pyspark_private`, `checkpoint`, `decode`,
`kafka`, `ledger`, `sink` and `startup` (the data path and what starts it faster).
Imported by `__main__`; only `temp_dirs` by `startup` (the warm-ups' own checkpoints) and by `entry` (`handoff
run`'s directory).
"""
