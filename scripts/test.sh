#!/usr/bin/env bash
# The whole test suite: ruff, mypy, then pytest (unit tests, the real-sshd namespace cluster,
# CPU training). `--install` first installs what the tests need (scripts/install-test-deps.sh).
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -x`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--install" ]; then
    shift
    scripts/install-test-deps.sh
fi

echo "== ruff"
ruff check fstrain tests benchmarks
echo "== mypy"
mypy
echo "== pytest"
exec python3 -m pytest -p no:cacheprovider "$@"
