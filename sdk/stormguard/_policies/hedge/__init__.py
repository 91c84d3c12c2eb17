"""Hedged requests: the policy (``policy.py``) and the state a client's calls share
(``state.py``: the recent latencies that set the delay, and the budget)."""
