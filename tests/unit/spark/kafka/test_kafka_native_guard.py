"""The librdkafka guard of the native Kafka reader (`kafka_native`, C `_kafka_native`): the extension is compiled
against one librdkafka's headers and bound at run time to confluent-kafka's bundled librdkafka; it may read records
only when the bound library's version and struct layouts match what it was compiled for. Otherwise the process
reads with confluent-kafka's Consumer and says so in one warning line."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import confluent_kafka
import pytest

from handoff_spark.kafka import _kafka_native
from handoff_spark.kafka import native as kafka_native
from handoff_spark.kafka.confluent_kafka_private import librdkafka_path

REPO = Path(__file__).resolve().parents[4]
V2_0_2, V2_16_0, V1_9_2, V3_0_0 = 0x020002FF, 0x021000FF, 0x010902FF, 0x030000FF
HEADERS = Path("/usr/include/librdkafka/rdkafka.h")


# -- the decision, as a pure function of (header version, bound version, what the layout probe found) --------

def test_a_library_of_the_headers_major_version_and_not_older_is_compatible():
    assert kafka_native.librdkafka_incompatibility(V2_0_2, V2_0_2, []) is None
    assert kafka_native.librdkafka_incompatibility(V2_0_2, V2_16_0, []) is None


def test_an_older_library_or_another_major_version_is_not():
    assert kafka_native.librdkafka_incompatibility(V2_16_0, V2_0_2, []) == "older than the headers"
    assert kafka_native.librdkafka_incompatibility(V2_0_2, 0x02000201, []) == "older than the headers"  # 2.0.2 RC1
    assert kafka_native.librdkafka_incompatibility(V2_0_2, V1_9_2, []) == "another major version"
    assert kafka_native.librdkafka_incompatibility(V2_0_2, V3_0_0, []) == "another major version"


def test_missing_functions_or_fields_that_do_not_read_back_are_not():
    problems = ["it has no rd_kafka_purge()", "rd_kafka_message_t.payload/len do not read back"]
    assert kafka_native.librdkafka_incompatibility(V2_0_2, V2_16_0, problems) == "; ".join(problems)
    # the version decides first: the probe is not run against a library of another major version
    assert kafka_native.librdkafka_incompatibility(V2_0_2, V3_0_0, problems) == "another major version"


def test_the_warning_is_one_line_naming_both_versions_and_a_fix():
    line = kafka_native.mismatch_warning(V2_16_0, V2_0_2, "older than the headers")
    assert "\n" not in line
    assert "librdkafka 2.16.0 headers" in line and "librdkafka is 2.0.2: older than the headers" in line
    assert f"{kafka_native.READER_ENV}=python" in line
    assert kafka_native.version_text(0x02000201) == "2.0.2-pre1"


# -- the real libraries --------------------------------------------------------------------------------------

def test_the_bound_library_reports_its_version_and_passes_the_check():
    """This process's binding: confluent-kafka's own librdkafka, its version as confluent-kafka reports it, every
    function found, every field read back, and the native reader on."""
    assert kafka_native.module() is _kafka_native, kafka_native.mismatch() or kafka_native.load_error()
    declared = int(re.search(r"#define RD_KAFKA_VERSION (0x[0-9a-fA-F]+)", HEADERS.read_text()).group(1), 16)
    assert _kafka_native.HEADER_VERSION == declared
    bound, missing = _kafka_native.load(librdkafka_path())
    assert bound == confluent_kafka.libversion()[1] and missing == ()
    assert _kafka_native.layout_problems() == []
    assert kafka_native.librdkafka_incompatibility(_kafka_native.HEADER_VERSION, bound, []) is None
    assert kafka_native.mismatch() is None and kafka_native.load_error() is None


def test_debians_own_librdkafka_passes_the_check_too():
    """The library the headers came with (Debian's librdkafka1), bound in a fresh process: the second version the
    layouts were checked against."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from handoff_spark.kafka import _kafka_native
        bound, missing = _kafka_native.load("librdkafka.so.1")
        print(hex(bound), missing, _kafka_native.layout_problems())
    """)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [hex(_kafka_native.HEADER_VERSION), "()", "[]"]


def _compile_against(tmp_path: Path, old: str, new: str) -> Path:
    """`_kafka_native.c` compiled as setup.py does, against a copy of the headers with `old` replaced by `new`: an
    extension whose idea of a struct's layout is not the bound library's."""
    headers = HEADERS.read_text()
    assert old in headers
    (tmp_path / "include" / "librdkafka").mkdir(parents=True)
    (tmp_path / "include" / "librdkafka" / "rdkafka.h").write_text(headers.replace(old, new, 1))
    out = tmp_path / "_kafka_native.so"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    assert shutil.which(cc), f"{cc}: the extension's compiler"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", f"-I{tmp_path / 'include'}",
                    f"-I{sysconfig.get_paths()['include']}", str(REPO / "spark_app/handoff_spark/kafka/_kafka_native.c"),
                    "-ldl", "-o", str(out)], check=True, capture_output=True)
    return out


# The extension compiled against a layout the bound library does not have, loaded as `handoff_spark.kafka._kafka_native`
# in a fresh process with the native reader asked for explicitly: asked twice which reader to use.
_FALLBACK = """
import importlib.util, logging, os, sys
spec = importlib.util.spec_from_file_location("handoff_spark.kafka._kafka_native", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
sys.modules["handoff_spark.kafka._kafka_native"] = native
os.environ["HANDOFF_KAFKA_READER"] = "native"
from handoff_spark.kafka import native as kafka_native
conf = {"bootstrap.servers": "127.0.0.1:9"}
print(kafka_native.use_native(conf), kafka_native.use_native(conf), kafka_native.consumer_factory(conf))
try:
    native.Reader({"bootstrap.servers": "127.0.0.1:9"})
except RuntimeError as e:
    print("Reader refused:", e)
"""


@pytest.mark.parametrize("struct, old, new", [
    ("rd_kafka_message_t", "        int32_t partition;       /**< Partition */\n        void *payload;",
     "        int32_t partition;       /**< Partition */\n        void *moved;\n        void *payload;"),
    ("rd_kafka_topic_partition_t", "        void *_private;          /**< INTERNAL USE ONLY,",
     "        void *_private;          void *grown; /**< INTERNAL USE ONLY,"),
])
def test_a_layout_mismatch_reads_with_python_and_warns_once(tmp_path, struct, old, new):
    """Never reads through the wrong layout, never fails: `native` asked for explicitly, the process still reads
    with confluent-kafka's Consumer, one warning line names both versions and the struct, and the extension
    itself refuses to make a Reader."""
    extension = _compile_against(tmp_path, old, new)
    run = subprocess.run([sys.executable, "-c", _FALLBACK, str(extension)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "False False None"
    assert lines[1].startswith("Reader refused: the librdkafka binding was not checked")
    warnings = [line for line in run.stderr.splitlines() if "native Kafka reader off" in line]
    assert len(warnings) == 1, run.stderr
    header = kafka_native.version_text(_kafka_native.HEADER_VERSION)
    bound = kafka_native.version_text(confluent_kafka.libversion()[1])
    assert f"librdkafka {header} headers" in warnings[0] and f"librdkafka is {bound}: {struct}" in warnings[0]
