"""LiteLLM proxy docs, "replace openai base": openai's client against an
OpenAI-compatible proxy.

The proxy's address (``http://0.0.0.0:4000``) is the deployment's; here it is read
from ``OPENAI_BASE_URL``."""

import os

import stormguard as openai  # openai v1.0.0+

client = openai.OpenAI(
    api_key="anything", base_url=os.environ["OPENAI_BASE_URL"]
)  # set proxy to base_url
# request sent to model set on litellm proxy, `litellm --model`
response = client.chat.completions.create(
    model="gpt-3.5-turbo",
    messages=[{"role": "user", "content": "this is a test request, write a short poem"}],
)

print(response)
