"""Whether a failed attempt is tried again, and when: which failures are worth it
and the backoff (``retry``), the retry budget shared by a client's calls
(``budget``), and client-side adaptive throttling (``throttle``).
"""
