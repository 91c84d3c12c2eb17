"""OpenAI API reference, "List models" and "Retrieve model"."""

from stormguard import OpenAI

client = OpenAI()

models = client.models.list()
for model in models:
    print(model.id)

print(client.models.retrieve("gpt-4o"))
