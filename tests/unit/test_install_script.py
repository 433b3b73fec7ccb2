"""scripts/install-test-deps.sh: waits for another apt's dpkg lock instead of failing."""

from __future__ import annotations

import re
import subprocess

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "install-test-deps.sh"


def test_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0


def test_every_apt_get_waits_for_the_dpkg_lock() -> None:
    text = SCRIPT.read_text()
    assert "APT=(apt-get -o DPkg::Lock::Timeout=600)" in text
    commands = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    bare = [line for line in commands if re.search(r"\bapt-get\b", line) and "APT=(" not in line
            and "echo" not in line]
    assert bare == [], f"apt-get called without the lock timeout: {bare}"
    assert text.count('"${APT[@]}"') == 2
