"""openai-python README, "``.with_streaming_response``": the body read line by line.

The README's snippet leaves the client out; ``client = OpenAI()`` is added."""

from stormguard import OpenAI

client = OpenAI()

with client.chat.completions.with_streaming_response.create(
    messages=[
        {
            "role": "user",
            "content": "Say this is a test",
        }
    ],
    model="gpt-4o",
) as response:
    print(response.headers.get("X-My-Header"))

    for line in response.iter_lines():
        print(line)
