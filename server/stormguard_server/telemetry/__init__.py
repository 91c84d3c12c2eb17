"""What the server tells the world: each request's record and its observers, the
Prometheus metrics, the spans of a request's trace, JSON logs."""
