"""OpenAI API reference, "Create completion" (legacy)."""

from stormguard import OpenAI

client = OpenAI()

completion = client.completions.create(
    model="gpt-3.5-turbo-instruct", prompt="Say this is a test", max_tokens=7, temperature=0
)
print(completion.choices[0].text)
