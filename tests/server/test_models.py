"""GET /v1/models/{id}: openai's Model for every served name, a slash in the id
included, and openai's 404 for any other id."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from openai.types import Model

from stormguard_server.app import create_app
from stormguard_server.config import ServerConfig
from tests.server.conftest import FAST_ENGINE
from tests.server.test_app import assert_openai_error

ALIAS = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ServerConfig(engine=FAST_ENGINE, model_aliases=(ALIAS,)))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield c


@pytest.mark.parametrize("path", ["stormguard-sim", ALIAS, ALIAS.replace("/", "%2F")])
async def test_every_served_name_is_an_openai_model(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(f"/v1/models/{path}")
    assert response.status_code == 200, response.text
    model = Model.model_validate(response.json())
    assert model.id in {"stormguard-sim", ALIAS} and model.object == "model"
    assert response.json()["max_model_len"] == FAST_ENGINE.max_model_len
    listed = (await client.get("/v1/models")).json()["data"]
    assert response.json() in listed


@pytest.mark.parametrize("model_id", ["gpt-9", "meta-llama/other", "stormguard-sim\n", "a/b/c"])
async def test_any_other_id_is_an_openai_404_that_names_it(
    client: httpx.AsyncClient, model_id: str
) -> None:
    response = await client.get("/v1/models/" + model_id.replace("\n", "%0A"))
    error = assert_openai_error(response, 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert f"`{model_id}`" in error["message"]
