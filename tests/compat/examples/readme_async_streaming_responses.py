"""openai-python README, "Streaming responses", the async client.

``main`` is annotated ``-> None`` (the README leaves it bare), as mypy --strict asks of
any code."""

import asyncio

from stormguard import AsyncOpenAI

client = AsyncOpenAI()


async def main() -> None:
    stream = await client.responses.create(
        model="gpt-4o",
        input="Write a one-sentence bedtime story about a unicorn.",
        stream=True,
    )

    async for event in stream:
        print(event)


asyncio.run(main())
