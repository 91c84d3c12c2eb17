"""openai-python README, "Accessing raw response data (e.g. headers)"."""

from stormguard import OpenAI

client = OpenAI()
response = client.chat.completions.with_raw_response.create(
    messages=[
        {
            "role": "user",
            "content": "Say this is a test",
        }
    ],
    model="gpt-4o",
)
print(response.headers.get("X-My-Header"))

completion = response.parse()  # get the object that `chat.completions.create()` would have returned
print(completion)
