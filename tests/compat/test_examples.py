"""openai-python's own examples, and LiteLLM's, against the reference server with only
the import changed.

"Only the import changed" means: where an example says ``from openai import OpenAI``
(or ``AsyncOpenAI``) it says ``from stormguard import OpenAI``, and where it says
``import openai`` it says ``import stormguard as openai``, so that ``openai.OpenAI(...)``
and ``except openai.APIStatusError`` read as before (stormguard exports ``OpenAI`` and
``AsyncOpenAI``: openai's clients over stormguard's pipeline where openai is installed,
its ``Client`` and ``AsyncClient`` where not). Every other
line is the example's; where one had to differ (a call outside stormguard's surface, an
import the snippet forgot, a top-level ``await``, a proxy's address), the example's
docstring says how and why.

Each example runs in the three forms of forms.py: as written (``stormguard.OpenAI``), on
``stormguard.Client`` under openai's names, and through
``openai.OpenAI(http_client=stormguard.httpx_client(...))``. The examples
build their clients as openai's do, with no base URL or key: both come from
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. The server serves the examples' model names
as aliases of one simulated model; ``gpt-4`` is not one of them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from stormguard import AsyncClient
from tests.compat.forms import EXAMPLES, FORMS, Form, example_names
from tests.e2e.server_process import RunningServer, free_port, run_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

SERVED = (
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-3.5-turbo",
    "gpt-3.5-turbo-instruct",
    "text-embedding-ada-002",
    "text-embedding-3-small",
)

Run = Callable[[str], dict[str, Any]]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    aliases = [arg for name in SERVED for arg in ("--model-alias", name)]
    # A request without max_tokens asks for the whole window (2048 tokens): a KV cache
    # four windows large admits it; short answers (8-23 tokens) keep the directory fast.
    sizes = ("--num-kv-blocks", "512", "--natural-output-tokens", "16")
    with run_server(*aliases, *sizes) as running:
        yield running


@pytest.fixture(params=FORMS, ids=lambda form: form.name)
def form(request: pytest.FixtureRequest) -> Form:
    param: Form = request.param
    return param


@pytest.fixture
def run(server: RunningServer, form: Form, monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """``run(example)`` executes the example in ``form`` as a script against the server
    and returns its globals; sync clients it left open are closed after the test."""
    for name in ("STORMGUARD_BASE_URL", "STORMGUARD_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-compat-example-key")
    namespaces: list[dict[str, Any]] = []

    def run_example(example: str) -> dict[str, Any]:
        path = EXAMPLES / f"{example}.py"
        namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(path)}
        namespaces.append(namespace)
        exec(compile(form.source(example), str(path), "exec"), namespace)
        return namespace

    yield run_example
    for namespace in namespaces:
        client = namespace.get("client")
        if client is not None and not isinstance(client, (AsyncClient, openai.AsyncOpenAI)):
            client.close()


def answered(server: RunningServer, route: str) -> float:
    """The server's 200 responses on ``route`` so far."""
    return server.metric(f'stormguard_responses_total{{route="{route}",status="200"}}')


def printed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_readme_responses(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    response = run("readme_responses")["response"]
    assert response.output_text.strip()
    assert response.model == "gpt-4o"
    assert capsys.readouterr().out == response.output_text + "\n"


def test_readme_chat_completions(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    completion = run("readme_chat_completions")["completion"]
    content = completion.choices[0].message.content
    assert content.strip() and completion.model == "gpt-4o"
    assert capsys.readouterr().out == content + "\n"


def test_readme_async_responses(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    run("readme_async_responses")
    assert "".join(printed(capsys)).strip()


def test_readme_streaming_responses(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    last = run("readme_streaming_responses")["event"]
    assert last.type in ("response.completed", "response.incomplete")
    events = printed(capsys)
    assert "response.created" in events[0] and last.type in events[-1]
    assert sum("response.output_text.delta" in line for line in events) >= 1


def test_readme_async_streaming_responses(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    run("readme_async_streaming_responses")
    events = printed(capsys)
    assert "response.created" in events[0]
    assert "response.completed" in events[-1] or "response.incomplete" in events[-1]


def test_readme_async_chat_completions(run: Run, server: RunningServer) -> None:
    before = answered(server, "/v1/chat/completions")
    completion = run("readme_async_chat_completions")
    assert "chat_completion" not in completion  # main's local, as in the README
    assert answered(server, "/v1/chat/completions") == before + 1


def test_readme_handling_errors_status_error(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    run("readme_handling_errors")
    lines = printed(capsys)
    assert lines[:2] == ["Another non-200-range status code was received", "404"]
    assert "404" in lines[2]  # the httpx response


def test_readme_handling_errors_server_unreachable(
    run: Run, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
    run("readme_handling_errors")
    lines = printed(capsys)
    assert lines[0] == "The server could not be reached"
    assert lines[1] not in ("", "None")  # the underlying exception


def test_readme_request_ids(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    response = run("readme_request_ids")["response"]
    assert response._request_id
    assert printed(capsys) == [response._request_id]


def test_readme_request_id_of_an_error(
    run: Run, form: Form, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(form.errors.NotFoundError) as raised:
        run("readme_request_id_of_an_error")
    assert raised.value.status_code == 404
    # Every answer of the reference server has an x-request-id, a refusal's too.
    assert raised.value.request_id
    assert printed(capsys) == [raised.value.request_id]


def test_readme_retries(run: Run, server: RunningServer) -> None:
    before = answered(server, "/v1/chat/completions")
    run("readme_retries")
    assert answered(server, "/v1/chat/completions") == before + 1


def test_readme_timeouts(run: Run, server: RunningServer) -> None:
    before = answered(server, "/v1/chat/completions")
    run("readme_timeouts")
    assert answered(server, "/v1/chat/completions") == before + 1


def test_readme_raw_response(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    ran = run("readme_raw_response")
    response, completion = ran["response"], ran["completion"]
    assert response.status_code == 200 and response.headers["x-request-id"]
    assert completion.choices[0].message.content.strip()
    lines = printed(capsys)
    assert lines[0] == "None"  # the server sends no X-My-Header
    assert "choices" in "".join(lines[1:]) or "Choice" in "".join(lines[1:])


def test_readme_streaming_response(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    response = run("readme_streaming_response")["response"]
    assert response.is_closed
    lines = printed(capsys)
    assert lines[0] == "None"
    body = json.loads("".join(lines[1:]))
    assert body["object"] == "chat.completion" and body["model"] == "gpt-4o"


def test_api_chat_streaming(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    last = run("api_chat_streaming")["chunk"]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert len(printed(capsys)) >= 2


def test_api_completions(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    completion = run("api_completions")["completion"]
    assert completion.usage.completion_tokens <= 7
    assert capsys.readouterr().out == completion.choices[0].text + "\n"


def test_api_embeddings(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    vector = run("api_embeddings")["response"].data[0].embedding
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-4)
    assert printed(capsys) == [str(vector)]


def test_api_models(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    run("api_models")
    lines = printed(capsys)
    assert set(SERVED) <= set(lines[:-1])
    assert "gpt-4o" in lines[-1]


def test_litellm_proxy_chat(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    response = run("litellm_proxy_chat")["response"]
    assert response.choices[0].message.content.strip()
    assert response.model == "gpt-3.5-turbo"
    assert len(printed(capsys)) == 1


def test_litellm_proxy_extra_body(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    response = run("litellm_proxy_extra_body")["response"]
    assert response.choices[0].message.content.strip()
    assert len(printed(capsys)) == 1


def test_every_example_has_its_test() -> None:
    tests = [name for name in globals() if name.startswith("test_")]
    untested = [e for e in example_names() if not any(t.startswith(f"test_{e}") for t in tests)]
    assert untested == []


# Every example but the one that imports httpx itself (readme_timeouts), and what each
# ends with when it runs as the tests above expect.
WITHOUT_HTTPX = {name: "ok" for name in example_names() if name != "readme_timeouts"}
WITHOUT_HTTPX["readme_request_id_of_an_error"] = "NotFoundError"


@pytest.mark.parametrize("form_name", [form.name for form in FORMS])
def test_the_examples_run_with_httpx2_alone(server: RunningServer, form_name: str) -> None:
    """openai 3.x runs on httpx2; stormguard runs with nothing but httpx2 installed too,
    as its own client and as openai's transport (httpx made unimportable in a child
    process)."""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "sk-compat-example-key",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    for name in ("STORMGUARD_BASE_URL", "STORMGUARD_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        env.pop(name, None)
    ran = subprocess.run(
        [sys.executable, "-m", "tests.compat.without_httpx", form_name, *WITHOUT_HTTPX],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout.splitlines()[-1])
    assert report["library"] == "httpx2"
    assert report["httpx_imported"] is False
    ended = {name: outcome["ended"] for name, outcome in report["outcomes"].items()}
    assert ended == WITHOUT_HTTPX
    assert report["outcomes"]["readme_chat_completions"]["printed"].strip()
