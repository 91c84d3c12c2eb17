"""schemathesis fuzzes the real server from its own OpenAPI schema: no 500s, ever.

For every operation in /openapi.json, schema-valid and schema-violating
requests (wrong types, missing fields, huge numbers, odd strings), a bounded
number of each; the server must answer every one with a non-5xx status and
keep serving. (schemathesis's pytest plugin does not load under pytest 9, so
its strategies are driven by hypothesis directly.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from tests.e2e.server_process import RunningServer, run_server

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 30


@pytest.fixture(scope="module")
def fuzzed_server() -> Iterator[RunningServer]:
    # A generous queue, so that fuzzing never meets a legitimate 503 shed.
    with run_server("--max-queue-requests", "10000") as server:
        yield server


def fuzzer(
    operation: Any, mode: GenerationMode, server: RunningServer, statuses: list[int]
) -> Callable[[], None]:
    """A hypothesis test that sends ``operation``'s generated cases to ``server``."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(base_url=server.root, timeout=30)
        statuses.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    return fuzz  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(fuzzed_server: RunningServer, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(fuzzed_server.url("/openapi.json"))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions"}
    if mode is GenerationMode.NEGATIVE:
        # Only operations that take input can be sent invalid input.
        operations = [op for op in operations if op.method.upper() == "POST" or op.path_parameters]
    seen: dict[str, list[int]] = {}
    for operation in operations:
        statuses = seen.setdefault(f"{operation.method.upper()} {operation.path}", [])
        try:
            fuzzer(operation, mode, fuzzed_server, statuses)()
        except Unsatisfiable:
            # schemathesis cannot violate this schema (e.g. a free-form string path
            # parameter); what it could generate has been sent.
            assert mode is GenerationMode.NEGATIVE
    for name in ("POST /v1/chat/completions", "POST /v1/completions", "POST /tokenize"):
        assert len(seen[name]) >= EXAMPLES_PER_OPERATION // 2, (name, len(seen[name]))
    assert all(status < 500 for statuses in seen.values() for status in statuses)
    if mode is GenerationMode.NEGATIVE:
        assert all(400 <= status < 500 for status in seen["POST /v1/completions"])


def test_still_serving_after_the_fuzz(fuzzed_server: RunningServer) -> None:
    assert httpx.get(fuzzed_server.url("/health")).status_code == 200
    metrics = fuzzed_server.metrics()
    server_errors = sum(
        value
        for name, value in metrics.items()
        if name.startswith("stormguard_responses_total") and 'status="5' in name
    )
    assert server_errors == 0
