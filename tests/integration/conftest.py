"""Fixtures shared by the operator's integration tests."""
from __future__ import annotations

from typing import Iterator

import pytest

from operator_support import Cluster, install_crds


@pytest.fixture(scope="module")
def cluster(apiserver) -> Iterator[Cluster]:
    """The test bed's API server with Handoff's CRDs installed, and clients for it."""
    install_crds(str(apiserver.kubeconfig))
    c = Cluster(str(apiserver.kubeconfig))
    yield c
    c.api.close()
