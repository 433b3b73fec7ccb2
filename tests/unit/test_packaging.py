"""Packaging: ``pip install 'fstrain[train]'`` keeps the torch a user already has, when it is in
the range the extra accepts; CI pins one version inside that range through constraints/ci.txt.

The install checks ask pip itself (``--dry-run --report``) in a virtual environment that sees
the packages of the one running the tests, with no index and no pip configuration: whatever pip
would have to download makes it fail, so nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.helpers import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: pytest brings tomli there
    import tomli as tomllib


def requirement(extra: str, name: str) -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    [found] = [r for r in map(Requirement, project["optional-dependencies"][extra]) if r.name == name]
    return found


def ci_pins() -> dict[str, Version]:
    lines = (REPO / "constraints" / "ci.txt").read_text().splitlines()
    pins = {}
    for line in lines:
        if line.strip() and not line.startswith("#"):
            pin = Requirement(line)
            [spec] = pin.specifier
            assert spec.operator == "==", line  # one release, for reproducible runs
            pins[pin.name] = Version(spec.version)
    return pins


def lowest(requirement: Requirement) -> Version:
    [bound] = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    return bound


def test_the_train_extra_is_a_range_that_holds_ci_pins() -> None:
    torch = requirement("train", "torch")
    assert not [s for s in torch.specifier if s.operator in ("==", "===")]  # a range, not CI's pin
    pins = ci_pins()
    assert pins["torch"] in torch.specifier and lowest(torch) < pins["torch"]
    assert pins["deepspeed"] in requirement("train", "deepspeed").specifier
    # the test script installs with the pins
    assert "-c constraints/ci.txt" in (REPO / "scripts" / "install-test-deps.sh").read_text()


def pip_would_install(tmp_path: Path, torch_version: str | None) -> tuple[int, list[str], str]:
    """``pip install --dry-run '.[train]'`` in a virtual environment over this one's packages,
    with torch ``torch_version`` installed there (metadata only), or this environment's own torch:
    (pip's exit code, the names it would install, its stderr)."""
    project = tmp_path / "project"  # the metadata only: nothing is built in the checkout
    (project / "fstrain").mkdir(parents=True)
    (project / "fstrain" / "__init__.py").write_text("")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # This environment's packages (pip, setuptools, torch, ...) behind the new one's own, whether
    # the tests run in a virtual environment or not (--system-site-packages would see the base only).
    (site / "this-environment.pth").write_text(
        "".join(f"{p}\n" for p in sys.path if p.endswith(("site-packages", "dist-packages"))))
    if torch_version is not None:
        info = site / f"torch-{torch_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
        (info / "INSTALLER").write_text("pip\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, find-links or constraints from this machine's config
    report = tmp_path / "report.json"
    # pip comes from this environment; --no-build-isolation: setuptools from there too
    done = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--disable-pip-version-check", "--quiet", "--report", str(report), f"{project}[train]"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    names = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]] \
        if done.returncode == 0 else []
    return done.returncode, names, done.stderr


def test_an_installed_torch_in_the_range_is_kept(tmp_path: Path) -> None:
    code, names, err = pip_would_install(tmp_path, None)  # this machine's torch (CI: the pinned one)
    assert (code, names) == (0, ["fstrain"]), err


@pytest.mark.slow
def test_the_oldest_accepted_torch_is_kept_and_an_older_one_is_not(tmp_path: Path) -> None:
    oldest = lowest(requirement("train", "torch"))
    code, names, err = pip_would_install(tmp_path / "oldest", str(oldest))
    assert (code, names) == (0, ["fstrain"]), err
    older = f"{oldest.major}.{oldest.minor - 1}.0"
    code, names, err = pip_would_install(tmp_path / "older", older)
    assert code != 0 and "No matching distribution found for torch" in err, (code, names, err)
