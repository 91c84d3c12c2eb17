"""openai-python's README "Handling errors" with ``import openai`` kept for its
``except`` clauses and only the client stormguard's: the handlers catch what
``stormguard.Client(openai_errors=True)`` raises, and what ``stormguard.OpenAI`` (openai's
client over stormguard) raises with no option, against the reference server.

The example file is the compat one (tests/compat/examples/readme_handling_errors.py);
its stormguard lines are turned back into openai's import and a ``stormguard.Client``
built with the option (or ``stormguard.OpenAI`` as it is), the rest runs unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

import stormguard
from tests.compat.forms import EXAMPLES
from tests.e2e.server_process import RunningServer, free_port, run_server

pytestmark = pytest.mark.e2e

EXAMPLE = EXAMPLES / "readme_handling_errors.py"
KEEP_OPENAI = ("import stormguard as openai\n", "import openai\n")
CLIENT = ("from stormguard import OpenAI\n", "from stormguard import Client as OpenAI\n")
OPT_IN = ("client = OpenAI()\n", "client = OpenAI(openai_errors=True)\n")


def source(*rewrites: tuple[str, str]) -> str:
    text = EXAMPLE.read_text()
    for old, new in (KEEP_OPENAI, *rewrites):
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
        if isinstance(client, (stormguard.Client, openai.OpenAI)):
            client.close()
    return namespace


#: The two clients whose errors openai's handlers catch.
CATCHING = {"client_opt_in": (CLIENT, OPT_IN), "openai_client": ()}


@pytest.mark.parametrize("rewrites", CATCHING.values(), ids=CATCHING.keys())
def test_a_status_error_reaches_openais_handler(
    server: RunningServer,
    env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    rewrites: tuple[tuple[str, str], ...],
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    execute(source(*rewrites))
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["Another non-200-range status code was received", "404"]
    assert "404" in lines[2]  # the response


@pytest.mark.parametrize("rewrites", CATCHING.values(), ids=CATCHING.keys())
def test_an_unreachable_server_reaches_openais_connection_handler(
    env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    rewrites: tuple[tuple[str, str], ...],
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
    execute(source(*rewrites))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "The server could not be reached"
    assert lines[1] not in ("", "None")  # the underlying exception


def test_without_the_option_openais_handlers_catch_nothing(
    server: RunningServer, env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    with pytest.raises(stormguard.NotFoundError) as info:
        execute(source(CLIENT))
    assert not isinstance(info.value, openai.OpenAIError)
