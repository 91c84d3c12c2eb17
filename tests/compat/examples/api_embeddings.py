"""OpenAI API reference, "Create embeddings", and the embeddings guide's read of the
vector."""

from stormguard import OpenAI

client = OpenAI()

client.embeddings.create(
    model="text-embedding-ada-002",
    input="The food was delicious and the waiter...",
    encoding_format="float",
)

response = client.embeddings.create(
    input="Your text string goes here", model="text-embedding-3-small"
)

print(response.data[0].embedding)
