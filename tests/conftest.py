"""Shared pytest fixtures: the repository root and the real network-namespace test cluster."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.build_ops import extensions_dir
from tests.helpers import require_tool

REPO = Path(__file__).resolve().parent.parent
TESTCLUSTER = REPO / "scripts" / "testcluster.sh"
CLUSTER_SIZE = 4


@dataclass(frozen=True)
class NamespaceCluster:
    """The hosts node1..nodeN in namespaces fst-node1..N, reachable over real sshd."""

    state: Path
    num_hosts: int
    cluster_id: str = ""  # FSTRAIN_TESTCLUSTER_ID: "" for the default cluster

    @property
    def subnet(self) -> str:
        return f"198.18.{self.cluster_id or 0}"

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet}.1"

    def veth(self, index: int) -> str:
        """The root-side end of host ``index``'s link (take it down to cut the host off)."""
        return f"fst{self.cluster_id}veth{index}"

    @property
    def ssh_config(self) -> str:
        return str(self.state / "ssh_config")

    @property
    def hostfile(self) -> str:
        return str(self.state / "hostfile")

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    @property
    def names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.num_hosts + 1)]

    def address(self, index: int) -> str:
        return f"{self.subnet}.{10 + index}"

    def namespace(self, index: int) -> str:
        return f"fst{self.cluster_id}-node{index}"

    def home(self, index: int) -> Path:
        """Host ``index``'s own HOME (see ``hermetic_hosts``)."""
        return self.state / "homes" / f"node{index}"

    def script(self, *args: str) -> None:
        """Run scripts/testcluster.sh against this cluster (stop-sshd I, start-sshd I, ...)."""
        env = {**os.environ, "FSTRAIN_TESTCLUSTER_DIR": str(self.state), "FSTRAIN_TESTCLUSTER_ID": self.cluster_id}
        subprocess.run([str(TESTCLUSTER), *args], check=True, env=env, timeout=60, capture_output=True)

    def in_namespace(self, index: int, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.namespace(index), *argv],
                              capture_output=True, text=True, check=check, timeout=60)


@pytest.fixture(scope="session", autouse=True)
def hermetic_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This machine's side of every test (fstrain itself, and localhost as a node) gets its own HOME.

    fstrain keeps state under ~/.fstrain (runs started here, active runs of localhost as a node) and
    OpenSSH and paramiko read ~/.ssh: none of the user's own may leak into a test, nor a test's into
    them. Child processes inherit the variables. DeepSpeed's CPU ops are built once per machine and
    version into TORCH_EXTENSIONS_DIR (tests/build_ops.py: the hosts of the test cluster share the
    same folder, and so do the workers of a parallel run; torch's builder takes a file lock, so the
    first builds and the others wait for it).
    """
    saved = {name: os.environ.get(name) for name in ("HOME", "TORCH_EXTENSIONS_DIR", "COLUMNS", "LINES")}
    # A terminal's size is the caller's (pytest-xdist sets COLUMNS=80 in its workers): fstrain's
    # output to a pipe must read the same whatever the shell or the runner set.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))  # from the real HOME
    home = tmp_path_factory.mktemp("client-home")
    os.environ["HOME"] = str(home)
    try:
        yield home
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def worker_index() -> int | None:
    """This pytest-xdist worker's index (gw0 -> 0), None outside a parallel run."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def cluster_id_for_worker() -> str:
    """FSTRAIN_TESTCLUSTER_ID for this process's cluster: the one set (default ""), and in a
    parallel run one more per worker (gw0 -> base + 1, ...), so each worker has its own namespaces,
    subnet and Slurm (scripts/testcluster.sh takes 1..250; the test Slurm adds 100)."""
    base = os.environ.get("FSTRAIN_TESTCLUSTER_ID", "")
    index = worker_index()
    return base if index is None else str(int(base or 0) + index + 1)


def hermetic_hosts(cluster: NamespaceCluster) -> None:
    """Make every host's sessions independent of this machine's set-up.

    - HOME: an empty folder per host. Root's own ~/.bashrc (pyenv, conda: they put another
      python3 first, even for non-interactive ssh sessions), ~/.fstrain (other test sessions'
      run records) and ~/.cache stay out of the tests.
    - PYTHONPATH: this checkout, so what the hosts run (``python -m fstrain.train``) is the code
      under test, not whichever fstrain happens to be installed (CI runs on a fresh clone).
    - TORCH_EXTENSIONS_DIR: the suite's one folder (``hermetic_client``, tests/build_ops.py), so
      DeepSpeed builds its CPU ops once (under an empty HOME each host would build them again).
    """
    for index in range(1, cluster.num_hosts + 1):
        cluster.home(index).mkdir(parents=True, exist_ok=True)
        cluster.script("set-env", str(index), f"HOME={cluster.home(index)}")
        cluster.script("set-env", str(index), f"PYTHONPATH={REPO}")
        cluster.script("set-env", str(index), f"TORCH_EXTENSIONS_DIR={os.environ['TORCH_EXTENSIONS_DIR']}")


def cluster_unavailable_reason() -> str | None:
    """Why the test cluster cannot be built here (a skip, a failure in CI); None when it can."""
    if os.geteuid() != 0:
        return "the test cluster needs root (network namespaces)"
    return None


def require_cluster_tools() -> None:
    """What the test cluster is built with: missing, the tests fail (they are test dependencies)."""
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("ssh-keygen", "openssh-client")):
        require_tool(tool, f"apt-get install {package}")
    if not Path("/usr/sbin/sshd").exists():
        pytest.fail("openssh-server is not installed, and the tests need it: run scripts/install-test-deps.sh "
                    "(or apt-get install openssh-server)", pytrace=False)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """Bring the cluster up once per session and down at the end."""
    reason = cluster_unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the cluster tests: {reason}")
        pytest.skip(reason)
    require_cluster_tools()
    state = tmp_path_factory.mktemp("testcluster")
    cluster_id = cluster_id_for_worker()
    env = {**os.environ, "FSTRAIN_TESTCLUSTER_DIR": str(state), "FSTRAIN_TESTCLUSTER_ID": cluster_id}
    subprocess.run([str(TESTCLUSTER), "up", str(CLUSTER_SIZE)], check=True, env=env, timeout=120,
                   capture_output=True)
    try:
        made = NamespaceCluster(state=state, num_hosts=CLUSTER_SIZE, cluster_id=cluster_id)
        hermetic_hosts(made)
        yield made
    finally:
        subprocess.run([str(TESTCLUSTER), "down"], check=False, env=env, timeout=120, capture_output=True)


# The real components a test can touch, each through its fixture only, and the marker it must then
# carry (and only then): `-m "not cluster"` and friends leave out exactly what needs them.
COMPONENT_MARKERS = {"cluster": "the namespace test cluster", "slurm": "the test Slurm", "gpu": "a GPU"}


def marker_mismatches(items: list[pytest.Item]) -> list[str]:
    """Each test whose markers do not say which real components it uses (through fixtures)."""
    problems = []
    for item in items:
        params = set(getattr(getattr(item, "callspec", None), "params", {}))  # a parameter, not a fixture
        uses = (set(getattr(item, "fixturenames", ())) - params) & set(COMPONENT_MARKERS)
        marked = {name for name in COMPONENT_MARKERS if item.get_closest_marker(name) is not None}
        for name in sorted(uses - marked):
            problems.append(f"{item.nodeid} uses {COMPONENT_MARKERS[name]} (fixture `{name}`) without "
                            f"@pytest.mark.{name}")
        for name in sorted(marked - uses):
            problems.append(f"{item.nodeid} is marked {name} but does not use the `{name}` fixture")
    return problems


# Longest first: the tests that wait on real processes (training, Slurm, the cluster), then the
# `slow` ones, then the many short unit tests, which fill the workers' last minutes. pytest-xdist's
# `load` scheduling hands tests out in this order, so no long test starts near the end.
LONG_MARKERS = ("train", "slurm", "cluster")


def run_order(item: pytest.Item) -> int:
    if any(item.get_closest_marker(name) is not None for name in LONG_MARKERS):
        return 0
    return 1 if item.get_closest_marker("slow") is not None else 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    problems = marker_mismatches(items)
    if problems:
        raise pytest.UsageError("markers that are not true (hint: mark the file with `pytestmark = "
                                "pytest.mark.NAME`, or take the component through its fixture):\n  "
                                + "\n  ".join(problems))
    items.sort(key=run_order)  # stable: within a rank, the files' own order


@pytest.fixture(scope="session")
def gpu() -> object:
    """A CUDA device for the GPU tests (the lent GPU machine); skipped without one."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda", torch.cuda.device_count() - 1)
