"""The HTTP plumbing under every route: connections and their deadlines, the ASGI
middlewares (load headers, body and request limits, request ids), OpenAI error
bodies, every refusal's status and headers, SSE framing, the client's disconnect."""
