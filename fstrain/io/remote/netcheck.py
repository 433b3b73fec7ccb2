"""Network facts and reachability checks, run on a host over SSH (stdlib only).

Usage (as sent: ``python3 - MODE ARGS`` with this file on stdin):

- ``info WORKDIR [PACKAGE...]``: JSON with hostname, IPv4 interfaces, python and package versions,
  whether WORKDIR exists, and where each PACKAGE imports from in WORKDIR (``importable``);
- ``listen PORT [PORT...]``: bind the first free port on all addresses, print
  ``{"port": P, "interfaces": [...]}`` (or ``{"port": null, "busy": [...]}``), accept and close
  connections until a line or the end of stdin, then close the port and exit;
- ``connect TIMEOUT ADDR:PORT [ADDR:PORT...]``: try each, print for each whether it connected
  and which local address and interface the connection used (the interface that routes there);
- ``probe WORKDIR TIMEOUT [ADDR:PORT...] -- [PACKAGE...]``: ``info``'s JSON with ``reach``,
  ``connect``'s list: a launch's whole check of a host in one session.

It imports only what a mode needs: it runs once per host of every launch.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs every host's check 3 ms
if TYPE_CHECKING:
    from typing import Any

SIOCGIFADDR = 0x8915
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one entry per GPU the driver sees (no nvidia-smi needed)


def interfaces() -> list[dict[str, Any]]:
    """IPv4 interfaces: name, address, state, MTU (from the kernel; no `ip` binary needed)."""
    found: list[dict[str, Any]] = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address
            found.append({
                "name": name,
                "address": socket.inet_ntoa(packed[20:24]),
                "state": read(f"/sys/class/net/{name}/operstate"),
                "mtu": int(read(f"/sys/class/net/{name}/mtu") or 0),
            })
    finally:
        probe.close()
    return found


def read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def package_version(name: str) -> str | None:
    """The version of the distribution ``name`` that the first sys.path entry holding it has:
    what importlib.metadata.version answers, read from its dist-info (or egg-info) folder
    without importing importlib.metadata (20 ms, on every host of every launch)."""
    wanted = normalized(name)
    for entry in sys.path:
        try:
            folders = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for folder in folders:
            stem, _, kind = folder.rpartition(".")
            if kind in ("dist-info", "egg-info") and normalized(stem.partition("-")[0]) == wanted:
                found = metadata_version(os.path.join(entry or ".", folder), kind)
                if found:
                    return found
    return None


def normalized(distribution: str) -> str:
    """A distribution's name as its metadata folder spells it (PEP 503, then - as _)."""
    return distribution.lower().replace("-", "_").replace(".", "_")


def metadata_version(path: str, kind: str) -> str | None:
    """The ``Version:`` of a dist-info folder's METADATA or an egg-info's PKG-INFO (a folder or
    the file itself)."""
    if kind == "dist-info":
        path = os.path.join(path, "METADATA")
    elif os.path.isdir(path):
        path = os.path.join(path, "PKG-INFO")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    return None  # the headers end at the first blank line
    except OSError:
        return None
    return None


def importable_from(name: str, workdir: str) -> str | None:
    """Where ``python -m NAME...`` started in ``workdir`` finds the package (its folder), or
    None: an installed distribution's metadata alone does not make it importable."""
    import importlib.util

    saved = list(sys.path)
    try:
        sys.path[:] = [os.path.expanduser(workdir) if workdir else os.getcwd(), *saved[1:]]
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    if spec is None:
        return None
    return os.path.dirname(spec.origin) if spec.origin else (list(spec.submodule_search_locations or []) or [name])[0]


def info(workdir: str, packages: list[str] | None = None) -> dict[str, Any]:
    hostname = socket.gethostname()
    try:
        resolved = socket.gethostbyname(hostname)
    except OSError:
        resolved = None
    return {
        "hostname": hostname,
        "home": os.path.expanduser("~"),
        "hostname_resolves_to": resolved,
        "interfaces": interfaces(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "torch": package_version("torch"),
        "deepspeed": package_version("deepspeed"),
        "nvidia_gpus": len(os.listdir(NVIDIA_GPUS)) if os.path.isdir(NVIDIA_GPUS) else 0,
        "workdir": workdir,
        "workdir_exists": os.path.isdir(os.path.expanduser(workdir)) if workdir else True,
        "fstrain": importable_from("fstrain", workdir),
        "importable": {name: importable_from(name, workdir) for name in packages or []},
    }


def listen(ports: list[int]) -> None:
    server = None
    busy = []
    for port in ports:
        candidate = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            candidate.bind(("0.0.0.0", port))
        except OSError:
            candidate.close()
            busy.append(port)
            continue
        server = candidate
        break
    if server is None:
        print(json.dumps({"port": None, "busy": busy}), flush=True)
        return
    # Every host connects at once: a queue of 128 overflows at a few hundred busy hosts (the
    # kernel drops their SYNs, and a retry after 1 s, 3 s, 7 s runs past the connect's limit).
    # The kernel caps it at net.core.somaxconn (4096 since Linux 5.4).
    server.listen(4096)
    print(json.dumps({"port": server.getsockname()[1], "busy": busy, "interfaces": interfaces()}), flush=True)

    def drain(conn: socket.socket) -> None:
        # Let the client close first: the TIME_WAIT then sits on its side, and the job can
        # bind this port the moment the listener is gone.
        conn.settimeout(10)
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        conn.close()

    import threading

    def accept_forever() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True).start()
    sys.stdin.readline()  # until the caller says it is done, or closes the channel
    server.close()


def interface_of(address: str) -> str | None:
    for entry in interfaces():
        if entry["address"] == address:
            return str(entry["name"])
    return None


def connect(timeout_s: float, targets: list[str]) -> list[dict[str, Any]]:
    results = []
    for target in targets:
        address, _, port = target.rpartition(":")
        entry: dict[str, Any] = {"target": target, "ok": False}
        try:
            with socket.create_connection((address, int(port)), timeout=timeout_s) as conn:
                local = conn.getsockname()[0]
            entry.update(ok=True, local_address=local, interface=interface_of(local))
        except OSError as exc:
            entry["error"] = exc.strerror or str(exc)
        results.append(entry)
    return results


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "info":
        print(json.dumps(info(argv[1] if len(argv) > 1 else "", argv[2:])))
    elif mode == "listen":
        listen([int(p) for p in argv[1:]])
    elif mode == "connect":
        print(json.dumps(connect(float(argv[1]), argv[2:])))
    elif mode == "probe":
        targets, packages = argv[3:], []
        if "--" in targets:
            cut = targets.index("--")
            targets, packages = targets[:cut], targets[cut + 1:]
        print(json.dumps({**info(argv[1], packages), "reach": connect(float(argv[2]), targets)}))
    else:
        print(f"netcheck: unknown mode {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
