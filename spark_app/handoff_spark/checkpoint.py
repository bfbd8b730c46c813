"""The Spark checkpoint's layout, owned in one place: Spark's own offset log and Handoff's side files.

The checkpoint is a cache of where the stream is; the table's ledger is the truth (`driver.resume` decides whether
a checkpoint may be trusted). What is in it:

- `metadata`: `{"id": <query id>}`, stable across restarts of one checkpoint;
- `offsets/N` (Spark `OffsetSeqLog`): batch N's end offsets, written *before* the batch runs; a replayed batch
  reuses the file, so it is the authoritative answer to "which records does batch N contain". Line 1 `v1`,
  line 2 the batch metadata JSON, then one line per source (`{"<topic>": {"<partition>": <next offset>}}`, `-`
  for a source without offsets). Handoff queries have exactly one source;
- `commits/N`: Spark's own "batch N is done" marker, written after the sink's commit returned;
- `sources/handoff-initial.json`: the start of batch 0 (Spark does not persist a Python source's initial
  offsets; a query that crashes in batch 0 must replay the same range, and the sink needs that start);
- `sources/handoff-gaps.jsonl`: offsets retention deleted before they were read (`onOffsetOutOfRange=earliest`);
- `handoff/last-commit.json`: the sink's result of the newest batch, for the driver's progress record.

Where: a local directory (`file://` or a plain path: the checkpoint volume), an S3 prefix (`s3a://bucket/prefix`,
spec.checkpoint on S3: Spark reaches it through hadoop-aws's S3A, this module through pyarrow's S3 file system with
the endpoint, path style and region of switches.CHECKPOINT_S3_* and the AWS SDK's credential chain) or a Google Cloud
Storage prefix (`gs://bucket/prefix`: Spark through Google's GCS connector, this module through pyarrow's GCS file
system with switches.CHECKPOINT_GCS_* and Google's default credentials).
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from handoff_spark import switches

TopicPartition = tuple[str, int]
OffsetRange = dict[TopicPartition, tuple[int, int]]

INITIAL_OFFSETS_FILE = "sources/handoff-initial.json"
GAPS_FILE = "sources/handoff-gaps.jsonl"
LAST_COMMIT_FILE = "handoff/last-commit.json"
#: What Spark and Handoff keep under a checkpoint; `discard` removes exactly these (the directory itself may be
#: a volume's mount point and stays).
SPARK_ENTRIES = ("metadata", "offsets", "commits", "sources", "state", "handoff")


class OffsetLogError(RuntimeError):
    """The offset log does not hold what the batch needs (missing file, unexpected format)."""


class CheckpointLocationError(ValueError):
    """The checkpoint location is neither a local path nor an object store this module can reach (s3a://, gs://)."""


#: Object-store schemes whose checkpoints Handoff reads and writes (Spark through hadoop-aws's S3A or Google's GCS
#: connector, this module through pyarrow's S3 or GCS file system). Other schemes are refused when the spec is
#: validated.
OBJECT_STORE_SCHEMES = ("s3a", "gs")


def local_path(checkpoint: str) -> Path:
    """The directory of a `file://` URI or plain path."""
    parsed = urlparse(checkpoint)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else checkpoint)
    raise CheckpointLocationError(f"checkpoint {checkpoint!r}: not a local path")


def is_object_store(checkpoint: str) -> bool:
    return urlparse(checkpoint).scheme in OBJECT_STORE_SCHEMES


def sibling(checkpoint: str, name: str) -> str:
    """A location beside `checkpoint` (same parent directory or prefix), e.g. a Backfill's own checkpoint."""
    if is_object_store(checkpoint):
        return checkpoint.rstrip("/").rsplit("/", 1)[0] + "/" + name
    return str(local_path(checkpoint).parent / name)


def atomic_write(path: Path, text: str) -> None:
    """Write through a temporary file and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _LocalFiles:
    """A checkpoint on a mounted volume (or any local directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, relative: str) -> str | None:
        try:
            return (self.root / relative).read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(self, relative: str, text: str) -> None:
        atomic_write(self.root / relative, text)

    def names(self, relative: str) -> list[str]:
        try:
            return os.listdir(self.root / relative)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove(self, relative: str, ignore_errors: bool = False) -> bool:
        path = self.root / relative
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=ignore_errors)
        elif path.exists():
            path.unlink()
        else:
            return False
        return True

    def reachable(self) -> bool:
        return self.root.is_dir()


@functools.lru_cache(maxsize=4)
def _s3_filesystem(endpoint: str | None, region: str, path_style: str | None) -> Any:
    """pyarrow's S3 file system for the checkpoint's store (one per process and settings). Credentials come from
    the SDK's default chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (the driver pod's env from
    spec.checkpoint.credentialsSecret), else a web identity or the instance's role."""
    from pyarrow import fs as pafs

    kwargs: dict[str, Any] = {"region": region}
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
    if path_style is not None and path_style.strip().lower() in ("0", "false", "no", "off"):
        kwargs["force_virtual_addressing"] = True  # S3A's fs.s3a.path.style.access=false, said explicitly
    return pafs.S3FileSystem(**kwargs)


def s3_settings(env: Mapping[str, str] | None = None) -> tuple[str | None, str, str | None]:
    """(endpoint, region, path style) of the checkpoint's S3 store from the environment the operator renders
    (switches.CHECKPOINT_S3_*); region falls back to AWS_REGION, then us-east-1 (S3A's own default)."""
    environ = os.environ if env is None else env
    region = (switches.CHECKPOINT_S3_REGION(env) or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
              or "us-east-1")
    return switches.CHECKPOINT_S3_ENDPOINT(env), region, switches.CHECKPOINT_S3_PATH_STYLE(env)


def gcs_settings(env: Mapping[str, str] | None = None) -> tuple[str | None, bool]:
    """(endpoint, anonymous) of the checkpoint's GCS store from the environment the operator renders
    (switches.CHECKPOINT_GCS_*)."""
    anonymous = (switches.CHECKPOINT_GCS_ANONYMOUS(env) or "").strip().lower() in ("1", "true", "yes", "on")
    return switches.CHECKPOINT_GCS_ENDPOINT(env), anonymous


@functools.lru_cache(maxsize=4)
def _gcs_filesystem(endpoint: str | None, anonymous: bool) -> Any:
    """pyarrow's GCS file system for the checkpoint's store (one per process and settings). Credentials: none when
    `anonymous`, else Google's default chain (GOOGLE_APPLICATION_CREDENTIALS: the key file the operator mounts from
    spec.checkpoint.credentialsSecret; else the pod's workload identity)."""
    from pyarrow import fs as pafs

    kwargs: dict[str, Any] = {"anonymous": anonymous}
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
    return pafs.GcsFileSystem(**kwargs)


class _ObjectStoreFiles:
    """A checkpoint under an object-store prefix (`s3a://bucket/prefix`, `gs://bucket/prefix`). An object appears
    whole when its upload returns, so a plain write is as safe for a reader as the local temporary-file-and-rename;
    there are no directories, only prefixes.

    Why `names` lists recursively on GCS: pyarrow's GCS file system lists one level only through directory marker
    objects (`offsets/`), which Spark's connector writes and pyarrow's own writes do not; a prefix that holds only
    pyarrow's files would look empty. For the same reason a "directory" is removed by its contents, never as a
    marker that may not exist."""

    def __init__(self, checkpoint: str) -> None:
        parsed = urlparse(checkpoint)
        if not parsed.netloc:
            raise CheckpointLocationError(
                f"checkpoint {checkpoint!r}: no bucket ({parsed.scheme}://<bucket>/<prefix>)")
        self.base = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        self.gcs = parsed.scheme == "gs"
        self.fs = _gcs_filesystem(*gcs_settings()) if self.gcs else _s3_filesystem(*s3_settings())

    def _path(self, relative: str) -> str:
        return f"{self.base}/{relative.strip('/')}" if relative.strip("/") else self.base

    def read(self, relative: str) -> str | None:
        try:
            with self.fs.open_input_stream(self._path(relative)) as fh:
                return bytes(fh.read()).decode()
        except FileNotFoundError:
            return None

    def write(self, relative: str, text: str) -> None:
        with self.fs.open_output_stream(self._path(relative)) as fh:
            fh.write(text.encode())

    def _infos(self, relative: str, recursive: bool = False) -> list[Any]:
        from pyarrow import fs as pafs

        return self.fs.get_file_info(pafs.FileSelector(self._path(relative), allow_not_found=True,
                                                       recursive=recursive))

    def names(self, relative: str) -> list[str]:
        if not self.gcs:
            return [info.base_name for info in self._infos(relative)]
        root = self._path(relative).rstrip("/") + "/"
        found = {info.path[len(root):].split("/", 1)[0] for info in self._infos(relative, recursive=True)
                 if info.path.startswith(root)}
        return sorted(name for name in found if name)

    def remove(self, relative: str, ignore_errors: bool = False) -> bool:
        from pyarrow import fs as pafs

        path = self._path(relative)
        try:
            info = self.fs.get_file_info(path)
            if info.type == pafs.FileType.File:
                self.fs.delete_file(path)
            elif self.gcs:
                children = self._infos(relative, recursive=True)
                if not children and info.type != pafs.FileType.Directory:
                    return False
                for child in children:
                    if child.type == pafs.FileType.File:
                        self.fs.delete_file(child.path)
                self._remove_marker(path)
            elif info.type == pafs.FileType.Directory:
                self.fs.delete_dir(path)
            else:
                return False
        except OSError:
            if ignore_errors:
                return False
            raise
        return True

    def _remove_marker(self, path: str) -> None:
        """The `path/` marker object Spark's connector may have left (absent for pyarrow's own files)."""
        try:
            self.fs.delete_file(path + "/")
        except (FileNotFoundError, OSError):
            pass

    def reachable(self) -> bool:
        return True


def files(checkpoint: str) -> _LocalFiles | _ObjectStoreFiles:
    """The checkpoint's files, wherever they are: a local directory, or an S3 or GCS prefix (s3a://, gs://)."""
    parsed = urlparse(checkpoint)
    if parsed.scheme in ("", "file"):
        return _LocalFiles(local_path(checkpoint))
    if parsed.scheme in OBJECT_STORE_SCHEMES:
        return _ObjectStoreFiles(checkpoint)
    raise CheckpointLocationError(
        f"checkpoint {checkpoint!r}: only local paths, file://, s3a:// and gs:// are supported")


def read_text(checkpoint: str, relative: str) -> str | None:
    return files(checkpoint).read(relative)


def read_json(checkpoint: str, relative: str) -> Any:
    text = read_text(checkpoint, relative)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


# ------------------------------------------------------------------------------------------- offset log

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
    text = read_text(checkpoint, f"offsets/{batch_id}")
    return None if text is None else parse_offset_file(text)


def initial_offsets(checkpoint: str) -> dict[TopicPartition, int] | None:
    text = read_text(checkpoint, INITIAL_OFFSETS_FILE)
    return None if text is None else parse_offset_file(text)


def write_initial_offsets(checkpoint: str, offsets: dict[str, dict[str, int]]) -> None:
    files(checkpoint).write(INITIAL_OFFSETS_FILE, json.dumps(offsets, sort_keys=True))


def batch_range(checkpoint: str, batch_id: int) -> OffsetRange:
    """`{(topic, partition): (start, end)}` of batch `batch_id`, end exclusive.

    A partition that appears only in the end offsets (a new partition, or a topic added to the handoff) has an
    empty range at its entry offset: the source admits it there and reads it from the next batch on
    (`kafka.source.add_new_partitions`, `plan_ranges`). Why not from 0: the ledger would then claim offsets no
    task read (a topic added at `startingOffsets: latest` would look backfilled, and a Backfill of its history
    would be refused as an overlap)."""
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
    return {tp: (start.get(tp, e), e) for tp, e in sorted(end.items())}


def to_json_ranges(ranges: OffsetRange) -> dict[str, dict[str, list[int]]]:
    """Ledger form: `{"topic": {"partition": [start, end]}}` (what `handoff.offsets` stores)."""
    out: dict[str, dict[str, list[int]]] = {}
    for (topic, partition), (start, end) in sorted(ranges.items()):
        out.setdefault(topic, {})[str(partition)] = [start, end]
    return out


def from_json_ranges(doc: dict[str, dict[str, list[int]]]) -> OffsetRange:
    return {(topic, int(p)): (int(se[0]), int(se[1])) for topic, parts in doc.items() for p, se in parts.items()}


# ------------------------------------------------------------------------------------ where Spark resumes

def query_id(checkpoint: str) -> str | None:
    """Spark's query id, stable across restarts of one checkpoint (`<checkpoint>/metadata`)."""
    doc = read_json(checkpoint, "metadata")
    return doc.get("id") if isinstance(doc, dict) else None


def _batch_ids(checkpoint: str, log: str) -> list[int]:
    return sorted(int(n) for n in files(checkpoint).names(log) if n.isdigit())


@dataclass(frozen=True)
class ResumePoint:
    """What Spark will do when a query starts on this checkpoint.

    `next_start`: the start offsets of the next batch Spark runs (None: the checkpoint holds no position, the
    source's `initialOffset` decides). `pending_batch`: a batch Spark planned but did not mark done; it is re-run
    with the same range (`pending_end` is its end), and the sink skips it if the table already has it.
    """

    query_id: str | None
    next_start: dict[TopicPartition, int] | None
    pending_batch: int | None
    pending_end: dict[TopicPartition, int] | None

    @property
    def empty(self) -> bool:
        return self.next_start is None and self.pending_batch is None


def resume_point(checkpoint: str) -> ResumePoint:
    planned = _batch_ids(checkpoint, "offsets")
    qid = query_id(checkpoint)
    if not planned:
        return ResumePoint(qid, initial_offsets(checkpoint), None, None)
    last = planned[-1]
    end = end_offsets(checkpoint, last)
    if last in _batch_ids(checkpoint, "commits"):
        return ResumePoint(qid, end, None, None)
    start = initial_offsets(checkpoint) if last == 0 else end_offsets(checkpoint, last - 1)
    return ResumePoint(qid, start, last, end)


def discard(checkpoint: str) -> list[str]:
    """Remove Spark's and Handoff's state from the checkpoint (the directory stays: it may be a mount point).
    Returns what was removed. The next query on it starts fresh, from the table's ledger."""
    store = files(checkpoint)
    removed = [name for name in SPARK_ENTRIES if store.remove(name)]
    if isinstance(store, _LocalFiles):
        for crc in store.root.glob(".metadata*.crc"):
            crc.unlink()
    return removed


# ------------------------------------------------------------------------------------------ side files

def append_gap(checkpoint: str, record: dict[str, Any]) -> None:
    store = files(checkpoint)
    if isinstance(store, _LocalFiles):
        path = store.root / GAPS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        return
    # An object store has no append: read, add the line, put it back (the source records gaps from the driver's
    # planning, one at a time).
    store.write(GAPS_FILE, (store.read(GAPS_FILE) or "") + json.dumps(record) + "\n")


def gaps_in(checkpoint: str, ranges: OffsetRange) -> dict[str, dict[str, list[int]]]:
    """Offsets retention deleted inside `ranges` (recorded by the source with onOffsetOutOfRange=earliest), in
    ledger form `{"topic": {"partition": [from, to]}}`: the commit records them, so the ledger says which offsets
    of its range never reached the table."""
    text = read_text(checkpoint, GAPS_FILE)
    out: dict[str, dict[str, list[int]]] = {}
    for line in (text or "").splitlines():
        try:
            gap = json.loads(line)
        except json.JSONDecodeError:
            continue
        se = ranges.get((gap.get("topic"), gap.get("partition")))
        if se is not None and se[0] <= int(gap["from"]) < se[1]:
            out.setdefault(gap["topic"], {})[str(gap["partition"])] = [int(gap["from"]), int(gap["to"])]
    return out


#: The last RECENT_COMMITS commit records, so the driver's progress reporter finds a batch's record even when
#: the next batch committed before it polled (an AvailableNow run's batches can finish within one poll).
RECENT_COMMITS_FILE = "handoff/recent-commits.json"
RECENT_COMMITS = 32


def write_last_commit(checkpoint: str, result: dict[str, Any]) -> None:
    recent = read_json(checkpoint, RECENT_COMMITS_FILE)
    kept = [r for r in recent if isinstance(r, dict)] if isinstance(recent, list) else []
    kept = [r for r in kept if r.get("batch_id") != result.get("batch_id")][-(RECENT_COMMITS - 1):] + [result]
    files(checkpoint).write(RECENT_COMMITS_FILE, json.dumps(kept))
    files(checkpoint).write(LAST_COMMIT_FILE, json.dumps(result))


def read_commit(checkpoint: str, batch_id: int) -> dict[str, Any] | None:
    """Batch `batch_id`'s commit record (None when this checkpoint has none for it)."""
    last = read_last_commit(checkpoint)
    if last is not None and int(last.get("batch_id", -1)) == batch_id:
        return last
    recent = read_json(checkpoint, RECENT_COMMITS_FILE)
    for record in reversed(recent if isinstance(recent, list) else []):
        if isinstance(record, dict) and int(record.get("batch_id", -1)) == batch_id:
            return record
    return None


def read_last_commit(checkpoint: str) -> dict[str, Any] | None:
    doc = read_json(checkpoint, LAST_COMMIT_FILE)
    return doc if isinstance(doc, dict) else None


#: The Kafka cluster id and topic ids the driver found at start; every ledger entry the sink commits records them.
KAFKA_IDENTITY_FILE = "handoff/kafka-identity.json"


def write_kafka_identity(checkpoint: str, identity: dict[str, Any]) -> None:
    files(checkpoint).write(KAFKA_IDENTITY_FILE, json.dumps(identity, sort_keys=True))


def read_kafka_identity(checkpoint: str) -> dict[str, Any] | None:
    doc = read_json(checkpoint, KAFKA_IDENTITY_FILE)
    return doc if isinstance(doc, dict) else None


#: The dedupe keys the checkpoint's Spark state is keyed by (`driver.resume`): `{"dedupeKeys": [...] | null,
#: "keyTypes": {key: Spark type}, "recordsAsRows": bool}`, written at every start (the types once Spark has planned the
#: SQL: a key the SQL derives has no type before). Spark refuses a state whose key schema changed
#: (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE). `recordsAsRows`: the query that wrote the checkpoint ran the DataFrame path
#: (records as Spark rows), not the fused one; the other path's query does not resume it.
STATE_KEYS_FILE = "handoff/state-keys.json"


@dataclass(frozen=True)
class StateKeys:
    """What `STATE_KEYS_FILE` says: `recorded` False for a checkpoint written before the file existed."""

    recorded: bool
    keys: list[str] | None = None
    types: dict[str, str] | None = None  # None: not known (written before Spark planned the SQL, or an older file)
    rows: bool | None = None  # the DataFrame path's checkpoint (None: an older file, which did not say)


def write_state_keys(checkpoint: str, keys: list[str] | None, types: dict[str, str] | None = None,
                     rows: bool | None = None) -> None:
    doc: dict[str, Any] = {"dedupeKeys": keys}
    if types:
        doc["keyTypes"] = types
    if rows is not None:
        doc["recordsAsRows"] = rows
    files(checkpoint).write(STATE_KEYS_FILE, json.dumps(doc))


def read_state_keys(checkpoint: str) -> StateKeys:
    doc = read_json(checkpoint, STATE_KEYS_FILE)
    if not isinstance(doc, dict) or "dedupeKeys" not in doc:
        return StateKeys(False)
    keys, types, rows = doc["dedupeKeys"], doc.get("keyTypes"), doc.get("recordsAsRows")
    return StateKeys(True, [str(k) for k in keys] if isinstance(keys, list) else None,
                     {str(k): str(v) for k, v in types.items()} if isinstance(types, dict) else None,
                     rows if isinstance(rows, bool) else None)


#: BigQuery: committed batches whose ledger-index row could not be written yet (the `record_batch` arguments of
#: each), written again at the next commit (`bigquery.sink`). The index is best effort, but not lossy: a row that
#: failed while BigQuery was briefly unavailable is written once it is back.
UNINDEXED_FILE = "handoff/bigquery-unindexed.json"


def read_unindexed(checkpoint: str) -> list[dict[str, Any]]:
    doc = read_json(checkpoint, UNINDEXED_FILE)
    return [r for r in doc if isinstance(r, dict)] if isinstance(doc, list) else []


def write_unindexed(checkpoint: str, rows: list[dict[str, Any]]) -> None:
    files(checkpoint).write(UNINDEXED_FILE, json.dumps(rows, sort_keys=True))


# ------------------------------------------------------------------ the DataFrame path's side files

#: Per batch, what the frame source's read tasks counted (`sink.frames`): `handoff/frames/<batch>/<range>.json`.
FRAMES_DIR = "handoff/frames"


def latest_planned_batch(checkpoint: str) -> tuple[int, int] | None:
    """(batch id, `batchWatermarkMs`) of the newest batch in Spark's offset log, or None before the first.

    Why the newest: Spark writes a batch's offset log entry before it plans that batch's input partitions, so
    while a source plans, the newest entry is the batch being planned (a restarted query re-plans the batch its
    offset log ends with, from the same entry). `batchWatermarkMs` is the watermark Spark's stateful operators use
    for that batch: what the frame source judges late records by."""
    ids = _batch_ids(checkpoint, "offsets")
    if not ids:
        return None
    text = read_text(checkpoint, f"offsets/{ids[-1]}") or ""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        watermark = int(json.loads(lines[1]).get("batchWatermarkMs", 0)) if len(lines) > 1 else 0
    except (ValueError, AttributeError):
        watermark = 0
    return ids[-1], watermark


def frames_dir(checkpoint: str, batch_id: int) -> str:
    """Batch `batch_id`'s counts, relative to the checkpoint."""
    return f"{FRAMES_DIR}/{batch_id}"


def write_frame_stats(checkpoint: str, batch_id: int, key: str, stats: dict[str, Any]) -> bool:
    """One read task's counts for batch `batch_id` (a retried attempt rewrites its own file). False when the
    checkpoint is not reachable from here (an executor pod without the driver's volume, or without the object
    store's credentials)."""
    try:
        store = files(checkpoint)
        if not store.reachable():
            return False
        store.write(f"{frames_dir(checkpoint, batch_id)}/{key}.json", json.dumps(stats, sort_keys=True))
    except OSError:
        return False
    return True


def read_frame_stats(checkpoint: str, batch_id: int) -> list[dict[str, Any]]:
    store = files(checkpoint)
    directory = frames_dir(checkpoint, batch_id)
    out = []
    for name in sorted(store.names(directory)):
        if not name.endswith(".json"):
            continue
        try:
            out.append(json.loads(store.read(f"{directory}/{name}") or ""))
        except (OSError, ValueError):
            continue
    return out


def clear_frame_stats(checkpoint: str, up_to: int | None = None, only: int | None = None) -> None:
    """Remove batch `only`'s counts (a batch being planned again), or those of every batch ≤ `up_to`."""
    store = files(checkpoint)
    for name in store.names(FRAMES_DIR):
        if not name.isdigit():
            continue
        n = int(name)
        if (only is not None and n == only) or (up_to is not None and n <= up_to):
            store.remove(f"{FRAMES_DIR}/{name}", ignore_errors=True)


#: Records the transform's SQL failed on (found by `driver.quarantine`): the frame source sends them to the
#: dead-letter topic instead of handing them to Spark. `[{"topic", "partition", "offset", "reason"}, …]`.
QUARANTINE_FILE = "handoff/quarantine.json"


def read_quarantine(checkpoint: str) -> list[dict[str, Any]]:
    doc = read_json(checkpoint, QUARANTINE_FILE)
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def add_quarantine(checkpoint: str, entries: list[dict[str, Any]]) -> None:
    known = read_quarantine(checkpoint)
    seen = {(d["topic"], int(d["partition"]), int(d["offset"])) for d in known}
    new = [e for e in entries if (e["topic"], int(e["partition"]), int(e["offset"])) not in seen]
    files(checkpoint).write(QUARANTINE_FILE, json.dumps(known + new, sort_keys=True))


#: The seed line (`driver.seed`): `{"topic": {"partition": offset}}`, where the ledger ended when a driver with a
#: dedupe started on an empty checkpoint. Records below it rebuild the dedupe's window and are not written again.
SEED_FILE = "sources/handoff-seed.json"


def seed_line_json(line: dict[TopicPartition, int]) -> str:
    """The line as a JSON document (the file, and the frame source's and rows writer's option)."""
    doc: dict[str, dict[str, int]] = {}
    for (topic, partition), off in sorted(line.items()):
        doc.setdefault(topic, {})[str(partition)] = off
    return json.dumps(doc, sort_keys=True)


def parse_seed_line(text: str | None) -> dict[TopicPartition, int]:
    if not text:
        return {}
    return {(topic, int(p)): int(off) for topic, parts in json.loads(text).items() for p, off in parts.items()}


def write_seed_line(checkpoint: str, line: dict[TopicPartition, int]) -> None:
    files(checkpoint).write(SEED_FILE, seed_line_json(line))


def read_seed_line(checkpoint: str) -> dict[TopicPartition, int]:
    return parse_seed_line(read_text(checkpoint, SEED_FILE))


def clip_to_seed_line(ranges: OffsetRange, line: dict[TopicPartition, int]) -> OffsetRange:
    """A batch's ranges as its commit records them: starting at the seed line where the batch began below it (its
    records below the line only rebuilt the dedupe's window and are in the table already; `driver.seed`)."""
    return {tp: (max(s, min(line.get(tp, s), e)), e) for tp, (s, e) in ranges.items()}
