"""One entry point for both sinks: a raw batch → (table, dead letters, writer schemas), whatever the format.

Why: `json`/`raw` decode in `decode.py`; the Schema Registry formats in `registry_decode.py`, which also report
the writer schema ids the rows were written with, for the ledger (`handoff.schemas`)."""
from __future__ import annotations

import pyarrow as pa

from .config import REGISTRY_FORMATS, AppConfig
from .decode import DeadLetter, decode_batch


def decode_source(raw: pa.Table, cfg: AppConfig) -> tuple[pa.Table, list[DeadLetter], dict[str, list[str]]]:
    """Decode per `cfg.source.format`; the third item is {schema id: ["subject:version", ...]} ({} for json/raw)."""
    fmt = cfg.source.format
    if fmt not in REGISTRY_FORMATS:
        table, dead = decode_batch(raw, cfg.schema_, fmt)  # type: ignore[arg-type]
        return table, dead, {}
    from .registry_decode import decode_registry_batch

    assert cfg.source.schema_registry is not None
    table, dead, uses = decode_registry_batch(raw, cfg.schema_, fmt, cfg.source.schema_registry)
    return table, dead, {str(u.schema_id): [f"{s}:{v}" for s, v in u.versions] for u in uses}
