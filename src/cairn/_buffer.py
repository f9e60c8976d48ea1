"""The buffer-protocol type, importable on every supported Python."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    from typing_extensions import Buffer

__all__ = ["Buffer"]
