"""The driver: the Structured Streaming query and its life (`app`), where it resumes (`resume`, the ledger over
the checkpoint, whose layout is the top-level `checkpoint`), per-batch progress and its publication to the
operator (`progress`, `publisher`), the live executor scaler (`executor_scaler`) and the driver's temp dirs
(`temp_dirs`).

May import every other folder. Imported by `__main__`; by `startup`, only `temp_dirs` (the warm-ups' own
checkpoints); by the operator, only `temp_dirs` (`handoff run`).
"""
