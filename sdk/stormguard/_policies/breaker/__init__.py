"""A circuit breaker per (endpoint, model): what counts against it (``breaker``),
when it trips and recovers (``config``), its states and what it hands out
(``states``), one breaker (``circuit``), and one per (endpoint, model), bounded in
number (``registry``).
"""
