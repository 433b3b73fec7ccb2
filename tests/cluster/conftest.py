"""Every cluster test starts on clean hosts and leaves them clean.

A test that fails half-way can leave its `fstrain launch` running, and with it ranks on the
hosts. Left alone, those would fail every later test that checks no job process is left. So at
the end of each test the launches it started and still running are stopped, and job processes
still on the hosts are killed; the test that left them fails (once), not the ones after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.launch_helpers import job_processes, kill_job_processes, stop_started_launches, wait_until_none

# How long the watchdogs get to end their jobs after the launcher stopped (grace periods of the
# tests are 3 to 5 s; teardown on a loaded 2-core machine takes longer).
SETTLE_S = 20


@pytest.fixture(autouse=True)
def _hosts_left_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    if "cluster" not in request.fixturenames:
        yield
        stop_started_launches()
        return
    cluster = request.getfixturevalue("cluster")
    before = kill_job_processes(cluster)
    if before:
        pytest.fail(f"job processes were running before this test (killed now): {before}")
    yield
    problems = []
    stopped = stop_started_launches()
    if stopped:
        problems.append(f"the test left `fstrain launch` running (stopped now): {stopped}")
    try:  # returns at once when nothing is left
        wait_until_none(lambda: job_processes(cluster), SETTLE_S)
    except AssertionError:
        problems.append(f"job processes outlived the test (killed now): {kill_job_processes(cluster)}")
    if problems:
        pytest.fail("; ".join(problems))
