"""Exact Kafka offset range of a micro-batch, read from Spark's own offset log.

Why: a sink's `commit(messages, batchId)` is told only the batch id. Spark writes batch N's end offsets to
`<checkpoint>/offsets/N` *before* running it, and a replayed batch reuses the same file, so the offset log
is the one authoritative source for "which records does batch N contain". The start of batch N is the end
of batch N-1; for batch 0 it is the source's initial offsets, which Spark does not persist for Python
sources, so the Kafka source writes them to `<checkpoint>/sources/handoff-initial.json`.

File format (Spark `OffsetSeqLog`): line 1 `v1`, line 2 the batch metadata JSON, then one line per source
holding that source's offset JSON (`{"<topic>": {"<partition>": <next offset>}}`), `-` for a source with
no offset yet. Handoff queries have exactly one source.
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

TopicPartition = tuple[str, int]
OffsetRange = dict[TopicPartition, tuple[int, int]]

INITIAL_OFFSETS_FILE = "sources/handoff-initial.json"


class OffsetLogError(RuntimeError):
    """The offset log does not hold what the batch needs (missing file, unexpected format)."""


def _local_path(checkpoint: str) -> Path:
    parsed = urlparse(checkpoint)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else checkpoint)
    raise OffsetLogError(f"checkpoint {checkpoint!r}: only local paths and file:// URIs are supported")


def _read_text(checkpoint: str, relative: str) -> str | None:
    path = _local_path(checkpoint) / relative
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def parse_source_offsets(text: str) -> dict[TopicPartition, int]:
    """`{"topic": {"0": 12}}` → `{("topic", 0): 12}`."""
    raw = json.loads(text)
    return {(topic, int(p)): int(off) for topic, parts in raw.items() for p, off in parts.items()}


def parse_offset_file(text: str) -> dict[TopicPartition, int]:
    """Parse one `offsets/N` file (or a plain source-offset JSON document) into end offsets."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise OffsetLogError("empty offset file")
    if not lines[0].startswith("v"):
        return parse_source_offsets(text)  # plain JSON (the initial offsets file)
    if len(lines) < 3:
        raise OffsetLogError(f"offset file has no source offsets: {text[:200]!r}")
    sources = [line for line in lines[2:] if line.strip() != "-"]
    if len(sources) != 1:
        raise OffsetLogError(f"expected exactly one source in the offset log, found {len(sources)}")
    return parse_source_offsets(sources[0])


def end_offsets(checkpoint: str, batch_id: int) -> dict[TopicPartition, int] | None:
    """End (exclusive) offsets of batch `batch_id`, or None if Spark has not planned that batch."""
    text = _read_text(checkpoint, f"offsets/{batch_id}")
    return None if text is None else parse_offset_file(text)


def initial_offsets(checkpoint: str) -> dict[TopicPartition, int] | None:
    text = _read_text(checkpoint, INITIAL_OFFSETS_FILE)
    return None if text is None else parse_offset_file(text)


def batch_range(checkpoint: str, batch_id: int) -> OffsetRange:
    """`{(topic, partition): (start, end)}` of batch `batch_id`, end exclusive.

    A partition that appears only in the end offsets (added to the topic mid-stream) starts at 0: the
    source reads new partitions from their beginning, and offsets below the log start simply hold no rows.
    """
    end = end_offsets(checkpoint, batch_id)
    if end is None:
        raise OffsetLogError(f"{checkpoint}/offsets/{batch_id} does not exist")
    if batch_id == 0:
        start = initial_offsets(checkpoint)
        if start is None:
            raise OffsetLogError(f"batch 0 needs the source's initial offsets in {checkpoint}/{INITIAL_OFFSETS_FILE}")
    else:
        start = end_offsets(checkpoint, batch_id - 1)
        if start is None:
            # Spark purges old offset files (minBatchesToRetain); the previous batch's file is always kept
            # because the log retains the last batches. Missing means a corrupt checkpoint.
            raise OffsetLogError(f"{checkpoint}/offsets/{batch_id - 1} (start of batch {batch_id}) does not exist")
    return {tp: (start.get(tp, 0), e) for tp, e in sorted(end.items())}


def to_json_ranges(ranges: OffsetRange) -> dict[str, dict[str, list[int]]]:
    """Ledger form: `{"topic": {"partition": [start, end]}}` (what `handoff.offsets` stores)."""
    out: dict[str, dict[str, list[int]]] = {}
    for (topic, partition), (start, end) in sorted(ranges.items()):
        out.setdefault(topic, {})[str(partition)] = [start, end]
    return out


def from_json_ranges(doc: dict[str, dict[str, list[int]]]) -> OffsetRange:
    return {(topic, int(p)): (int(se[0]), int(se[1])) for topic, parts in doc.items() for p, se in parts.items()}
