"""The driver: the Structured Streaming query and its life (`app`), where it resumes (`resume`, the ledger over
the checkpoint), the checkpoint's layout (`checkpoint`), per-batch progress and its publication to the operator
(`progress`, `publisher`), the live executor scaler (`executor_scaler`) and the driver's temp dirs (`temp_dirs`).

May import every other folder. Imported by `__main__` and by the operator's `handoff run` / `handoff replay`
entry points only.
"""
