"""The facade: ``Client`` and ``AsyncClient`` (``client``, ``async_client``, generated
one from the other, over ``base_client``), their resources (``resources``,
``async_resources``, ``api_specs``), openai-python's raw and streaming responses
(``raw_response``, ``streamed_response``, ``api_response``, ``handed_over_body``,
``body_pieces``), and ``stormguard.call_info`` (``call_info_lookup``).
"""
