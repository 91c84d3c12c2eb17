"""The line protocol between the drill and a client process it spawned (the fleet's and
the quota's workers): one JSON document a line, on the process's stdout and stdin.

The protocol has stdout to itself: ``claim_stdout()`` keeps a copy of the descriptor
for ``send()`` and points descriptor 1 and ``sys.stdout`` at stderr, so whatever a
library prints goes to the run's log, never into the protocol.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

_PROTOCOL: TextIO = sys.stdout  # claim_stdout() gives the protocol a descriptor of its own


def claim_stdout() -> None:
    """Keep stdout for the protocol; everything else written there goes to stderr."""
    global _PROTOCOL
    _PROTOCOL = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints of libraries: to the log
    sys.stdout = sys.stderr


def send(document: dict[str, Any] | str) -> None:
    """One line to the drill: a JSON text as it is, or a document to encode."""
    _PROTOCOL.write((document if isinstance(document, str) else json.dumps(document)) + "\n")
    _PROTOCOL.flush()
