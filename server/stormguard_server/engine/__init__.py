"""The engine seam (``base.py``: what the layers above need from any engine) and the
simulated engine behind it: KV blocks, the continuous-batching scheduler, the busy
loop, its faults and its offline tokenizer."""
