"""The frameworks' own code over stormguard (``make test-frameworks``, marker
``frameworks``). Each module is collected only where its framework is installed:
their venvs (.venv-frameworks with openai 3.x; .venv-frameworks-openai2 with openai
2.x) have them, the default one has none, so ``make test`` never imports them.

No network but loopback: the OpenAI Agents SDK would send its traces to OpenAI and
LangSmith its runs when asked, so both are turned off (test_openai_agents.py also
calls ``set_tracing_disabled``); any other https request goes to a proxy on a closed
loopback port, and fails at once.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

#: Each test module and the import it needs.
_NEEDS = {
    "test_langchain.py": "langchain_openai",
    "test_pydantic_ai.py": "pydantic_ai",
    "test_openai_agents.py": "agents",
    "test_instructor.py": "instructor",
    "test_llama_index.py": "llama_index.llms.openai",
}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


collect_ignore = [module for module, needs in _NEEDS.items() if not _installed(needs)]

#: The environment of every test here: no tracing sent anywhere, any https request
#: refused on loopback, and no key or URL of the machine's.
_ENVIRONMENT = {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
}
_UNSET = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "STORMGUARD_API_KEY", "STORMGUARD_BASE_URL")


@pytest.fixture(autouse=True, scope="session")
def _offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in _ENVIRONMENT.items():
            patch.setenv(name, value)
        for name in _UNSET:
            patch.delenv(name, raising=False)
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "frameworks":
            item.add_marker(pytest.mark.frameworks)
