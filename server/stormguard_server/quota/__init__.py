"""A hosted API's quota per API key (off unless a limit is set): the buckets and the
charge, and on the wire OpenAI's 429s, ``x-ratelimit-*`` headers and per-key metrics."""
