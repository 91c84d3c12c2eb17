"""openai-python README, "Request IDs": the request id of a failed request.

The README's snippet awaits at the top level and leaves the client out; a script
makes the client and the call without ``await``. The reference server does not serve
``gpt-4``, so the request fails."""

import stormguard as openai
from stormguard import OpenAI

client = OpenAI()

try:
    completion = client.chat.completions.create(
        messages=[{"role": "user", "content": "Say this is a test"}], model="gpt-4"
    )
except openai.APIStatusError as exc:
    print(exc.request_id)  # req_123
    raise exc
