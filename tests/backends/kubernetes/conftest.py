"""Fixtures: the fake API server and a connection to it through the real kubernetes client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.kubernetes.fake_api import FakeCluster
from trainmaster.backends.kubernetes import jobs as kubernetes


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    server = FakeCluster(tmp_path)
    server.thread.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def cluster(fake: FakeCluster) -> kubernetes.Cluster:
    return kubernetes.connect(str(fake.kubeconfig()), namespace="default")
