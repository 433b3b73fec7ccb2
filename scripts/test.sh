#!/usr/bin/env bash
# The whole test suite: ruff, mypy, then pytest (unit tests, the real-sshd namespace cluster, the
# real test Slurm, CPU training) on parallel workers, each with its own cluster and Slurm
# (docs/testing.md lists the parts, their times and the budget).
#
#   scripts/test.sh [--install] [--quick] [PYTEST ARGS...]
#
# --install  first installs what the tests need (scripts/install-test-deps.sh)
# --quick    the inner loop: the unit tests but the slow ones, and one smoke test per real
#            component (namespace cluster, Slurm, training); about 5 minutes on 2 cores
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -x`. FSTRAIN_TEST_WORKERS sets
# the number of workers (default 4: most cluster and Slurm time is spent waiting on processes;
# 0 runs everything in this one process). Without arguments, the tests marked `timing` run first,
# alone, then the rest on the workers; with arguments, one pytest run takes them all.
set -euo pipefail
cd "$(dirname "$0")/.."

install=0
quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --install) install=1; shift ;;
        --quick) quick=1; shift ;;
        *) break ;;
    esac
done
[ "$install" = 1 ] && scripts/install-test-deps.sh

workers=${FSTRAIN_TEST_WORKERS:-4}
parallel=()
if [ "$workers" != 0 ]; then
    # load, one test at a time (a worker holds at most two): each test goes to the next free
    # worker, in the order tests/conftest.py sorts them (the long ones that wait on processes
    # first, the many short unit tests last), so no queue of long tests waits behind one worker.
    parallel=(-n "$workers" --dist load --maxschedchunk 1)
fi
selection=()
if [ "$quick" = 1 ]; then
    selection=(-m "smoke or not (cluster or slurm or gpu or train or slow)")
fi

# DeepSpeed's CPU ops (tests/build_ops.py), built while ruff and mypy run on one core, so that no
# test waits for the compile on busy cores; once built (kept per machine and version) this takes
# a few seconds. The quick loop runs no DeepSpeed.
ops=""
if [ "$quick" = 0 ]; then
    python3 -m tests.build_ops &
    ops=$!
fi
# Byte-code for fstrain and the tests, written once: every fstrain command and rank a test starts
# would otherwise compile the same modules again where PYTHONDONTWRITEBYTECODE is set (0.17 s of
# CPU per `fstrain launch`), and Python reads these whether or not it may write its own.
python3 -m compileall -q fstrain tests benchmarks $([ -d examples ] && echo examples) >/dev/null
echo "== ruff"
ruff check fstrain tests benchmarks
echo "== mypy"
# mypy's incremental cache, kept per machine beside DeepSpeed's ops rather than in the clone: a
# fresh clone (CI's) checks its 230 files in about 2 s instead of 60 s of one core. mypy
# re-checks every file whose contents differ from what the cache saw, and what depends on it.
# FSTRAIN_TEST_MYPY_CACHE moves it; a cache of another mypy version is ignored by mypy itself.
mypy_cache=${FSTRAIN_TEST_MYPY_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/fstrain-tests/mypy}
mypy --cache-dir "$mypy_cache"
if [ -n "$ops" ] && ! wait "$ops"; then
    echo "test.sh: DeepSpeed's CPU ops did not build (above); the DeepSpeed tests will fail" >&2
fi
if [ "$quick" = 1 ] || [ $# -gt 0 ] || [ "$workers" = 0 ]; then
    echo "== pytest"
    exec python3 -m pytest -p no:cacheprovider "${parallel[@]}" "${selection[@]}" "$@"
fi
# The whole suite: first the `timing` tests, one at a time on otherwise idle cores (they assert
# that healthy links and collectives measure as healthy, which other tests' CPU load can
# disprove), then everything else on the workers.
echo "== pytest: timing tests, alone"
timing=0
python3 -m pytest -p no:cacheprovider -n 0 -m timing || timing=$?
echo "== pytest: the rest, on $workers workers"
rest=0
python3 -m pytest -p no:cacheprovider "${parallel[@]}" -m "not timing" || rest=$?
[ "$timing" = 0 ] && [ "$rest" = 0 ] && exit 0
echo "test.sh: timing tests exit $timing, the rest exit $rest" >&2
exit 1
