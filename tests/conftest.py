"""Every test run keeps this machine's shared quota buckets to itself.

The SDK shares each key's bucket among the processes of one machine through files
(``_policies/quota/_host_store.py``). A test run gets its own directory, so that two
runs on one machine (two checkouts, CI beside a developer's run) never pace each
other, and each test starts with none: the buckets of the test before it (a key on a
port that a later test's server reuses) are removed. Processes the tests start
inherit the directory through the environment.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

_DIRECTORY = tempfile.mkdtemp(prefix="stormguard-quota-test-")
os.environ["STORMGUARD_QUOTA_DIR"] = _DIRECTORY


@pytest.fixture(autouse=True)
def _fresh_quota_files() -> Iterator[None]:
    yield
    if os.environ.get("STORMGUARD_QUOTA_DIR") == _DIRECTORY:
        with os.scandir(_DIRECTORY) as entries:
            for entry in entries:
                if entry.name.endswith(".json"):
                    os.unlink(entry.path)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_DIRECTORY, ignore_errors=True)
