"""openai-python README, "Request IDs": ``_request_id`` of a result.

The README awaits at the top level, as in a notebook; a script makes the same call
without ``await`` on the sync client, as the README says for non-async usage."""

from stormguard import OpenAI

client = OpenAI()

response = client.responses.create(
    model="gpt-4o-mini",
    input="Say 'this is a test'.",
)
print(response._request_id)  # req_123
