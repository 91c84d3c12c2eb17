"""LiteLLM proxy docs: request metadata for the proxy's logging in ``extra_body``.

The proxy's address is the deployment's; here it is read from ``OPENAI_BASE_URL``."""

import os

import stormguard as openai

client = openai.OpenAI(api_key="anything", base_url=os.environ["OPENAI_BASE_URL"])

response = client.chat.completions.create(
    model="gpt-3.5-turbo",
    messages=[{"role": "user", "content": "this is a test request, write a short poem"}],
    extra_body={
        "metadata": {
            "generation_name": "ishaan-generation-openai-client",
            "generation_id": "openai-client-gen-id22",
            "trace_id": "openai-client-trace-id22",
            "trace_user_id": "openai-client-user-id2",
        }
    },
)

print(response)
