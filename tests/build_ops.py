"""DeepSpeed's CPU ops for the test suite, built once per machine and version.

DeepSpeed compiles two C++ ops the first time it runs on a CPU: its shared-memory communicator
(every ``deepspeed.init_distributed``) and CPUAdam (optimizer offload), about two CPU-minutes
together. The tests keep them in one folder that outlives a run, named by the Python, torch and
DeepSpeed versions that built them (``FSTRAIN_TEST_EXTENSIONS_DIR`` moves it; the default is
under ``$XDG_CACHE_HOME`` or ``~/.cache``). torch rebuilds an op there whose sources or flags
changed, and takes a file lock while it builds, so parallel workers and the test cluster's hosts
share the folder safely.

``python3 -m tests.build_ops`` builds both ahead of a run; ``scripts/test.sh`` does so while ruff
and mypy run, so no test waits for a compile on busy cores.
"""

from __future__ import annotations

import os
import sys
import time
from importlib import metadata
from pathlib import Path

OPS = ("ShareMemCommBuilder", "CPUAdamBuilder")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def extensions_dir() -> Path:
    """The folder the tests' TORCH_EXTENSIONS_DIR names (from the real HOME: read it before a
    test replaces HOME)."""
    base = os.environ.get("FSTRAIN_TEST_EXTENSIONS_DIR")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(cache, "fstrain-tests", "torch-extensions")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path(base) / f"{python}-torch{_version('torch')}-deepspeed{_version('deepspeed')}"


def main() -> int:
    folder = extensions_dir()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError as exc:
        print(f"build_ops: DeepSpeed is not importable ({exc}); install the test extras first "
              "(scripts/test.sh --install)", file=sys.stderr)
        return 1
    for name in OPS:
        started = time.monotonic()
        get_accelerator().create_op_builder(name).load(verbose=False)
        print(f"build_ops: {name} ready in {time.monotonic() - started:.1f} s ({folder})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
