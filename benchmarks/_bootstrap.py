"""`python benchmarks/<name>.py` (a file, not `-m`): the repository root on sys.path, so that `benchmarks.*` imports.

Imported first by every script, and only when it runs as a file (``if not __package__: import _bootstrap``); see
benchmarks/__init__.py.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
