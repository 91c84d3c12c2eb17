"""JSON responses that any string can go in.

Starlette encodes a body as UTF-8, and a lone surrogate (``"\\ud800"``, which JSON
allows as an escape and Python keeps as such) cannot be: a request whose model
name holds one would get a 500 from the error that echoes it. Such a body is
written with ASCII escapes instead, which every JSON reader decodes back to the
same string; every other body stays compact UTF-8, as before.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse as _StarletteJSONResponse

__all__ = ["JSONResponse"]


class JSONResponse(_StarletteJSONResponse):
    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escape it, and everything else
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")
