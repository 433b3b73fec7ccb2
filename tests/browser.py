"""A page opened in a real headless browser (Debian's chromium): its DOM after loading, every
message its console printed, and a screenshot."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import require_tool

# chromium --enable-logging=stderr prints each console message as
# `[pid:tid:time:INFO:CONSOLE:1] "text", source: file:///... (1)`.
CONSOLE_RE = re.compile(r":CONSOLE[:(]\d*\)?\]? ?(\".*)$")
WIDTH, HEIGHT = 1000, 2600


@dataclass(frozen=True)
class Opened:
    dom: str
    console: list[str]
    screenshot: Path


def open_page(page: Path, work: Path) -> Opened:
    """Load ``page`` twice, as a user's browser would: once for its DOM and console, once for a
    screenshot (``work``/``page``.png). Chromium's profile and HOME stay under ``work``."""
    chromium = require_tool("chromium", "apt-get install chromium")
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(work)}
    base = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={work / 'profile'}", f"--window-size={WIDTH},{HEIGHT}"]
    loaded = subprocess.run([*base, "--enable-logging=stderr", "--v=0", "--dump-dom", page.resolve().as_uri()],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    shot = work / (page.stem + ".png")
    taken = subprocess.run([*base, f"--screenshot={shot}", page.resolve().as_uri()], capture_output=True,
                           text=True, env=env, timeout=120, check=False)
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    console = [m.group(1) for line in loaded.stderr.splitlines() if (m := CONSOLE_RE.search(line))]
    return Opened(loaded.stdout, console, shot)
