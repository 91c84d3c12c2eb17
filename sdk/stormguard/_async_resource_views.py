"""The asynchronous resources' ``with_raw_response`` and ``with_streaming_response``
views, as openai-python's: the same methods, returning the final response with
the result (``.parse()``), or as context managers of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._raw_response import async_to_raw_response_wrapper
from ._streamed_response import async_to_streamed_response_wrapper

if TYPE_CHECKING:
    from ._async_resources import (
        AsyncChat,
        AsyncChatCompletions,
        AsyncCompletions,
        AsyncEmbeddings,
        AsyncModels,
        AsyncResponses,
    )


class AsyncChatCompletionsWithRawResponse:
    """``client.chat.completions.with_raw_response``."""

    def __init__(self, completions: AsyncChatCompletions) -> None:
        self.create = async_to_raw_response_wrapper(completions.create)


class AsyncCompletionsWithRawResponse:
    """``client.completions.with_raw_response``."""

    def __init__(self, completions: AsyncCompletions) -> None:
        self.create = async_to_raw_response_wrapper(completions.create)


class AsyncModelsWithRawResponse:
    """``client.models.with_raw_response``."""

    def __init__(self, models: AsyncModels) -> None:
        self.list = async_to_raw_response_wrapper(models.list)
        self.retrieve = async_to_raw_response_wrapper(models.retrieve)


class AsyncEmbeddingsWithRawResponse:
    """``client.embeddings.with_raw_response``."""

    def __init__(self, embeddings: AsyncEmbeddings) -> None:
        self.create = async_to_raw_response_wrapper(embeddings.create)


class AsyncResponsesWithRawResponse:
    """``client.responses.with_raw_response``."""

    def __init__(self, responses: AsyncResponses) -> None:
        self.create = async_to_raw_response_wrapper(responses.create)


class AsyncChatCompletionsWithStreamingResponse:
    """``client.chat.completions.with_streaming_response``."""

    def __init__(self, completions: AsyncChatCompletions) -> None:
        self.create = async_to_streamed_response_wrapper(completions.create)


class AsyncCompletionsWithStreamingResponse:
    """``client.completions.with_streaming_response``."""

    def __init__(self, completions: AsyncCompletions) -> None:
        self.create = async_to_streamed_response_wrapper(completions.create)


class AsyncModelsWithStreamingResponse:
    """``client.models.with_streaming_response``."""

    def __init__(self, models: AsyncModels) -> None:
        self.list = async_to_streamed_response_wrapper(models.list)
        self.retrieve = async_to_streamed_response_wrapper(models.retrieve)


class AsyncEmbeddingsWithStreamingResponse:
    """``client.embeddings.with_streaming_response``."""

    def __init__(self, embeddings: AsyncEmbeddings) -> None:
        self.create = async_to_streamed_response_wrapper(embeddings.create)


class AsyncResponsesWithStreamingResponse:
    """``client.responses.with_streaming_response``."""

    def __init__(self, responses: AsyncResponses) -> None:
        self.create = async_to_streamed_response_wrapper(responses.create)


class AsyncChatWithRawResponse:
    """``client.chat.with_raw_response``."""

    def __init__(self, chat: AsyncChat) -> None:
        self.completions = chat.completions.with_raw_response


class AsyncChatWithStreamingResponse:
    """``client.chat.with_streaming_response``."""

    def __init__(self, chat: AsyncChat) -> None:
        self.completions = chat.completions.with_streaming_response
