"""`relayproxy index`: build, finish or rebuild the transaction indexes of a relay directory (commands/find.py)."""

from __future__ import annotations

from .find import add_index_arguments as add_arguments
from .find import run_index as run

__all__ = ["add_arguments", "run"]
