"""openai-python's README "Handling errors" with ``import openai`` kept for its
``except`` clauses and only the client stormguard's: the handlers catch what
``stormguard.OpenAI(openai_errors=True)`` raises, against the reference server.

The example file is the compat one (tests/compat/examples/readme_handling_errors.py);
its two stormguard lines are turned back into openai's import and a client built with
the option, the rest runs unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

import stormguard
from tests.compat.forms import EXAMPLES
from tests.e2e.server_process import RunningServer, free_port, run_server

pytestmark = pytest.mark.e2e

EXAMPLE = EXAMPLES / "readme_handling_errors.py"
REWRITES = (
    ("import stormguard as openai\n", "import openai\n"),
    ("client = OpenAI()\n", "client = OpenAI(openai_errors=True)\n"),
)


def source(*, opt_in: bool = True) -> str:
    text = EXAMPLE.read_text()
    for old, new in REWRITES if opt_in else REWRITES[:1]:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with run_server() as running:
        yield running


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's client reads its key and base URL as openai's does."""
    for name in ("STORMGUARD_BASE_URL", "STORMGUARD_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-compat-example-key")


def execute(text: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "__main__", "__file__": str(EXAMPLE)}
    try:
        exec(compile(text, str(EXAMPLE), "exec"), namespace)
    finally:
        client = namespace.get("client")
        if isinstance(client, stormguard.Client):
            client.close()
    return namespace


def test_a_status_error_reaches_openais_handler(
    server: RunningServer,
    env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    execute(source())
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["Another non-200-range status code was received", "404"]
    assert "404" in lines[2]  # the response


def test_an_unreachable_server_reaches_openais_connection_handler(
    env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
    execute(source())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "The server could not be reached"
    assert lines[1] not in ("", "None")  # the underlying exception


def test_without_the_option_openais_handlers_catch_nothing(
    server: RunningServer, env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    with pytest.raises(stormguard.NotFoundError) as info:
        execute(source(opt_in=False))
    assert not isinstance(info.value, openai.OpenAIError)
