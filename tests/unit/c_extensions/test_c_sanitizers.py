"""ASan + UBSan builds of the C extensions run the fuzzing corpus and a generated set (issue 33).

`_json_arrow` here (json_arrow_sanitized_child.py beside this file says what the child runs); `_kafka_native` against
the test bed's broker in tests/integration/c_extensions/test_kafka_native_sanitized.py. A build with a read planted
one byte past the data fails this test (test_a_planted_overread_is_caught), so a clean run means something."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import sanitizers

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (hack/install-system-deps.sh)")

#: Generated values the child checks (each also fed straight to the sanitized module alone and in a batch).
GENERATED = 5_000
#: The child's script: json_arrow_sanitized_child from beside this file (sanitizers.run puts tests/ and tests/unit
#: on its path, for decode_fuzz_support).
SCRIPT = (f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
          "import json_arrow_sanitized_child as child\nchild.main({count})\n")


def test_json_arrow_under_asan_and_ubsan_runs_the_corpus_and_generated_values_cleanly(tmp_path: Path) -> None:
    built = sanitizers.build("handoff_spark.decode._json_arrow", tmp_path)
    proc = sanitizers.run(SCRIPT.format(count=GENERATED), {"handoff_spark.decode._json_arrow": built})
    assert proc.returncode == 0 and not sanitizers.findings(proc), (proc.returncode, proc.stderr[-6000:])
    counts = re.search(r"(\d+) corpus values, (\d+) generated values, (\d+) direct calls", proc.stdout)
    assert counts, proc.stdout
    corpus, generated, calls = map(int, counts.groups())
    assert corpus >= 70 and generated >= GENERATED and calls > 10 * generated


def test_a_planted_overread_is_caught(tmp_path: Path) -> None:
    """The same run against a scratch copy of _json_arrow.c whose whitespace skip reads the byte at the end of the
    value (one past it): ASan reports a heap-buffer-overflow and the child fails."""
    source = sanitizers.source("handoff_spark.decode._json_arrow").read_text()
    planted = source.replace("while (c->p < c->end && (*c->p == ' '", "while (c->p <= c->end && (*c->p == ' '")
    assert planted != source, "the line the plant changes moved; update the test"
    scratch = tmp_path / "_json_arrow_planted.c"
    scratch.write_text(planted)
    built = sanitizers.build("handoff_spark.decode._json_arrow", tmp_path, src=scratch)
    proc = sanitizers.run(SCRIPT.format(count=100), {"handoff_spark.decode._json_arrow": built})
    assert proc.returncode != 0
    assert any("heap-buffer-overflow" in line for line in sanitizers.findings(proc)), proc.stderr[-3000:]
