"""The pinned packages PyPI has only as source distributions are installed from wheels built once into the cache
(handoff_testbed.sdist_wheels): uv built pyspark again at every install and kept 2.8 GB of each build."""
from __future__ import annotations

import re

from handoff_testbed.paths import REPO_ROOT
from handoff_testbed.sdist_wheels import SDIST_ONLY, pinned_versions, stale_wheels


def test_the_lock_pins_every_source_only_package() -> None:
    lock = (REPO_ROOT / "requirements.lock").read_text()
    pins = pinned_versions(lock)
    assert set(pins) == set(SDIST_ONLY)
    assert pins["pyspark"] == re.search(r"^pyspark==(\S+)", lock, re.MULTILINE).group(1)  # type: ignore[union-attr]


def test_wheels_of_other_versions_of_a_pinned_package_are_stale() -> None:
    files = ["pyspark-4.3.0-py2.py3-none-any.whl", "pyspark-4.2.1-py2.py3-none-any.whl",
             "py4j-0.10.9.9-py2.py3-none-any.whl", "notes.txt"]
    assert stale_wheels(files, {"pyspark": "4.3.0"}) == ["pyspark-4.2.1-py2.py3-none-any.whl"]


def test_make_installs_the_lock_with_the_cached_wheels_on_find_links() -> None:
    """The venv's install step reads the wheel directory the module prints; without it uv builds pyspark again."""
    recipe = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r'wheels=\$\$\(PYTHONPATH=hack \$\(PY\) -m handoff_testbed\.sdist_wheels\) && \\\n'
                     r'\s+\$\(VENV\)/bin/uv pip install .*--find-links "\$\$wheels" -r requirements\.lock', recipe)
