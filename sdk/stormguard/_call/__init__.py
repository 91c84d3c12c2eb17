"""One logical call, without I/O but for its drivers: what is asked (``call_spec``,
``spec_builder``, ``openai_conventions``, ``arguments``, ``settings``) and the state
a client's calls share (``client_core``, ``stats``); the call itself, ``LogicalCall``
in ``pipeline`` over its state (``call_base``) and its helpers (``call_precheck``, ``call_events``,
``call_quota``, ``endpoint_choice``, ``attempt_record``, ``retry_loop``,
``call_result``), and its states
(``call_state``); its steps written once (``call_flow``, ``attempt_flow``) and the
I/O done by the only sync/async twins (``drivers``); and its streams
(``streaming`` on ``stream_core``, ``stream_events``, ``stream_state``,
``stream_timeouts``, ``unclosed``).
"""
