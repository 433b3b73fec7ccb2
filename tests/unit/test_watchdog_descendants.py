"""The watchdog's view of a job's process tree: from the children files, as a scan of /proc sees it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fstrain.io.remote.watchdog import children_of, descendants, descendants_by_scan, stat_fields


@contextmanager
def started(script: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sh", "-c", script])
    try:
        yield process
    finally:
        for pid in descendants_by_scan(process.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        process.kill()
        process.wait()


def wait_for(count: int, root: int) -> list[int]:
    deadline = time.monotonic() + 30
    while len(found := descendants_by_scan(root)) < count:
        assert time.monotonic() < deadline, found
        time.sleep(0.02)
    return found


def test_a_tree_of_three_levels_is_found_whole_children_first() -> None:
    with started("sleep 60 & sh -c 'sleep 60 & sleep 60 & wait' & wait") as root:
        scanned = wait_for(4, root.pid)
        walked = descendants(root.pid)
        assert sorted(walked) == sorted(scanned) and len(walked) == 4
        children = set(children_of(root.pid) or [])
        assert len(children) == 2 and set(walked[:2]) == children  # children before grandchildren


def test_a_zombie_is_not_a_live_descendant() -> None:
    # `sleep 0` ends first and nobody reaps it: the exec'd `sleep 60` never waits.
    with started("sleep 0 & exec sleep 60") as root:
        deadline = time.monotonic() + 30
        while not any((stat_fields(pid) or ["?"])[0] == "Z" for pid in children_of(root.pid) or []):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert descendants(root.pid) == [] == descendants_by_scan(root.pid)


def test_a_process_that_is_gone_has_no_descendants() -> None:
    process = subprocess.Popen(["true"])
    process.wait()
    assert descendants(process.pid) == [] and children_of(process.pid) == []
