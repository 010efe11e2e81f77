#!/usr/bin/env bash
# Creates the project's virtual environment from the lock file. Installs uv first when the
# machine lacks it, so a fresh Linux machine with Python 3.11+ needs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check uv
fi
uv sync --frozen --extra dev --quiet
