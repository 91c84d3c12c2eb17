"""openai-python README, "With aiohttp": a chat completion on the async client used as
a context manager.

The README's ``http_client=DefaultAioHttpClient()`` (openai's aiohttp backend) is left
out: that line chooses openai's HTTP backend, which stormguard replaces."""

import asyncio
import os

from stormguard import AsyncOpenAI


async def main() -> None:
    async with AsyncOpenAI(
        api_key=os.environ.get("OPENAI_API_KEY"),  # This is the default and can be omitted
    ) as client:
        chat_completion = await client.chat.completions.create(  # noqa: F841 (as in the README)
            messages=[
                {
                    "role": "user",
                    "content": "Say this is a test",
                }
            ],
            model="gpt-4o",
        )


asyncio.run(main())
