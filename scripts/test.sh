#!/usr/bin/env bash
# Set up (see setup.sh), then run the whole test suite, slow model-zoo tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check fxlens tests bench examples
.venv/bin/mypy fxlens
workers=$(.venv/bin/python -c "import os; print(min(os.cpu_count() or 1, 4))")
exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@"
