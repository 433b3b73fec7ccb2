#!/usr/bin/env bash
# Install what the test suite needs on Debian/Ubuntu: sshd and iproute2 for the namespace test
# cluster, slurm-wlm and munge for the test Slurm (scripts/testslurm.sh), pdsh for the fan-out
# benchmark, chromium to open `fstrain report`'s page, and the Python test extras (torch,
# deepspeed, accelerate, pytest, ruff, mypy, py-spy) at the versions CI pins in
# constraints/ci.txt (torch 2.13.0). Needs root (or sudo) for the Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "install-test-deps: run as root or install sudo" >&2; exit 1; }
    SUDO=sudo
fi

missing=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v pdsh >/dev/null 2>&1 || missing+=(pdsh)
command -v pgrep >/dev/null 2>&1 || missing+=(procps)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # opens `fstrain report`'s page (tests/browser.py)
# Another apt (unattended-upgrades on a fresh machine, a second CI job) may hold the dpkg lock:
# wait for it (up to 10 minutes) rather than fail.
APT=(apt-get -o DPkg::Lock::Timeout=600)
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-test-deps: apt-get install ${missing[*]}"
    $SUDO "${APT[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# PEP 668: stock Debian/Ubuntu refuse pip into the system Python; say what to do instead.
if python3 -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'; then
    :  # inside a virtual environment
elif [ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ]; then
    echo "install-test-deps: this python3 is managed by the system (PEP 668); make a venv first:" >&2
    echo "  python3 -m venv .venv && . .venv/bin/activate && scripts/test.sh --install" >&2
    exit 1
fi
python3 -m pip install -q --disable-pip-version-check -c constraints/ci.txt -e '.[test]'
