"""OpenAI API reference, "Create chat completion", streaming."""

from stormguard import OpenAI

client = OpenAI()

completion = client.chat.completions.create(
    model="gpt-4o",
    messages=[
        {"role": "developer", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"},
    ],
    stream=True,
)

for chunk in completion:
    print(chunk.choices[0].delta)
