"""Entry point: `python -m bench.run ...` or `python bench/run.py ...`."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
