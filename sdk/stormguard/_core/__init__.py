"""What every layer shares and nothing else: time (``clock``, ``deadline``), the
HTTP library in use (``http``), the exception tree (``exceptions``) and the one
verdict on an attempt's outcome (``verdict``, ``stop_reason``), the records a
result carries (``results``, ``record_shapes``, ``history``, ``precheck``,
``rate_limit_headers``), redaction (``redact``), logging (``logs``), and the small
machinery of shared state (``fork``, ``outbox``, ``sliding_window``, ``compat``).
"""
