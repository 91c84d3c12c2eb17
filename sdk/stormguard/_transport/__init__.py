"""The whole pipeline as an HTTP transport, for code that uses openai-python: the
transports (``transport``, ``httpx2``), the clients built on them (``clients``),
from another client's request to one call (``spec``) and back (``answers``,
``replay``), openai-python's own retries answered (``retries``), and
``stormguard.OpenAI`` built over it (``openai_client``).
"""
