"""The synchronous resources' ``with_raw_response`` and ``with_streaming_response``
views, as openai-python's: the same methods, returning the final response with
the result (``.parse()``), or as context managers of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._raw_response import to_raw_response_wrapper
from ._streamed_response import to_streamed_response_wrapper

if TYPE_CHECKING:
    from ._resources import (
        Chat,
        ChatCompletions,
        Completions,
        Embeddings,
        Models,
        Responses,
    )


class ChatCompletionsWithRawResponse:
    """``client.chat.completions.with_raw_response``."""

    def __init__(self, completions: ChatCompletions) -> None:
        self.create = to_raw_response_wrapper(completions.create)


class CompletionsWithRawResponse:
    """``client.completions.with_raw_response``."""

    def __init__(self, completions: Completions) -> None:
        self.create = to_raw_response_wrapper(completions.create)


class ModelsWithRawResponse:
    """``client.models.with_raw_response``."""

    def __init__(self, models: Models) -> None:
        self.list = to_raw_response_wrapper(models.list)
        self.retrieve = to_raw_response_wrapper(models.retrieve)


class EmbeddingsWithRawResponse:
    """``client.embeddings.with_raw_response``."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.create = to_raw_response_wrapper(embeddings.create)


class ResponsesWithRawResponse:
    """``client.responses.with_raw_response``."""

    def __init__(self, responses: Responses) -> None:
        self.create = to_raw_response_wrapper(responses.create)


class ChatCompletionsWithStreamingResponse:
    """``client.chat.completions.with_streaming_response``."""

    def __init__(self, completions: ChatCompletions) -> None:
        self.create = to_streamed_response_wrapper(completions.create)


class CompletionsWithStreamingResponse:
    """``client.completions.with_streaming_response``."""

    def __init__(self, completions: Completions) -> None:
        self.create = to_streamed_response_wrapper(completions.create)


class ModelsWithStreamingResponse:
    """``client.models.with_streaming_response``."""

    def __init__(self, models: Models) -> None:
        self.list = to_streamed_response_wrapper(models.list)
        self.retrieve = to_streamed_response_wrapper(models.retrieve)


class EmbeddingsWithStreamingResponse:
    """``client.embeddings.with_streaming_response``."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.create = to_streamed_response_wrapper(embeddings.create)


class ResponsesWithStreamingResponse:
    """``client.responses.with_streaming_response``."""

    def __init__(self, responses: Responses) -> None:
        self.create = to_streamed_response_wrapper(responses.create)


class ChatWithRawResponse:
    """``client.chat.with_raw_response``."""

    def __init__(self, chat: Chat) -> None:
        self.completions = chat.completions.with_raw_response


class ChatWithStreamingResponse:
    """``client.chat.with_streaming_response``."""

    def __init__(self, chat: Chat) -> None:
        self.completions = chat.completions.with_streaming_response
