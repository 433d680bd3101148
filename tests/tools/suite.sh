#!/usr/bin/env bash
# make test's suite, slow tests included, in two pytest runs one after the other:
#   1. every test but the heavy ones, two at a time (pytest-xdist -n 2, each test file on one worker,
#      so a file's shared step cache is built once): the suite's time is mostly waiting on servers,
#      subprocesses and timed slices, which a second worker fills;
#   2. the MiniLM and SmolLM2 tests (marked `heavy` by tests/conftest.py) in one process, so their GiBs
#      never sit beside another test's (the suite's memory target: under 4 GiB).
# Each run prints its 15 slowest tests and its peak RSS; the exit status is the first run's that failed
# (pytest's 5, no test collected, included: .ci/run fails on it).
set -u
PYTHON=${PYTHON:-python}
"$PYTHON" -m pytest -n 2 --dist loadfile -m "(slow or not slow) and not heavy" --durations=15 "$@"
first=$?
"$PYTHON" -m pytest -n 0 -m heavy --durations=15 "$@"
second=$?
if [ "$first" -ne 0 ]; then exit "$first"; fi
exit "$second"
