"""Real vLLM behind the same admission: the ASGI middleware vLLM loads, what a request
costs in vLLM's tokens, vLLM's live load, the launcher of ``--engine vllm``, and a tiny
offline model to serve."""
