"""Names that moved between the Python versions we support."""

import sys

if sys.version_info >= (3, 11):
    from typing import Self, Unpack
else:  # pragma: no cover - exercised on 3.10 only
    from typing_extensions import Self, Unpack

__all__ = ["Self", "Unpack"]
