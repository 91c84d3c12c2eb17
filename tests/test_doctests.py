"""The examples in the SDK's and the server's docstrings run, so they stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

import stormguard
import stormguard_server

# Modules whose import does something (starts a server) rather than define things.
_SKIPPED = {"stormguard_server.__main__"}


def _modules(package: ModuleType) -> list[str]:
    names = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
        if info.name not in _SKIPPED:
            names.append(info.name)
    return names


MODULES = _modules(stormguard) + _modules(stormguard_server)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed in {name}"


def test_the_examples_are_found() -> None:
    """A finder that found nothing would pass every module above."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = sum(
        len(test.examples)
        for name in (
            "stormguard._policies.retry.budget",
            "stormguard._policies.retry.retry",
            "stormguard.protocol",
        )
        for test in finder.find(importlib.import_module(name), name)
    )
    assert found >= 5
