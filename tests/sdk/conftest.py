"""Fixtures that run one test body against both Client and AsyncClient."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import respx

from tests.sdk.helpers import BASE, Api


@pytest.fixture(params=["sync", "async"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    helper = Api(request.param)
    yield helper
    await helper.close_all()


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router
