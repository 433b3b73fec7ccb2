"""Fan-out over SSH: `fstrain exec` against `pdsh -R ssh` on the same hosts, side by side.

Both run `echo ok` on N loopback hosts (127.0.1.1..N), each a separate SSH connection to one
sshd with a high MaxStartups, inside the namespace `scripts/testcluster.sh up-loopback N`
makes. Runs alternate (fstrain, pdsh, pdsh, fstrain, ...) so drift hits both; the result is
the ratio of medians. Every session of both tools runs the remote user's shell start-up
(root's ~/.bashrc on this machine, which may start pyenv or conda); --plain-home gives the
sessions an empty HOME instead. Needs root, openssh-server and pdsh.

    python benchmarks/fanout.py [--hosts 64] [--rounds 5] [--fanout 64] [--plain-home]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median, time_command

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "fst-loop"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fanout", type=int, default=64)
    parser.add_argument("--plain-home", action="store_true",
                        help="the hosts' sessions get an empty HOME, not this machine's (whose ~/.bashrc every "
                             "session of both tools runs)")
    args = parser.parse_args()
    if shutil.which("pdsh") is None:
        print("pdsh is not installed (apt-get install pdsh)", file=sys.stderr)
        return 2
    state = Path(tempfile.mkdtemp(prefix="fstrain-bench-"))
    env = {**os.environ, "FSTRAIN_TESTCLUSTER_DIR": str(state)}
    if args.plain_home:
        (state / "home").mkdir()
        env["FSTRAIN_TESTCLUSTER_HOME"] = str(state / "home")
    script = str(REPO / "scripts" / "testcluster.sh")
    subprocess.run([script, "up-loopback", str(args.hosts)], check=True, env=env, capture_output=True)
    try:
        results = compare(state, args.hosts, args.rounds, args.fanout)
    finally:
        subprocess.run([script, "down"], check=False, env=env, capture_output=True)
    report(results, args)
    return 0


def commands(state: Path, num_hosts: int, fanout: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    netns = ["ip", "netns", "exec", NAMESPACE]
    fstrain = [*netns, sys.executable, "-m", "fstrain", "exec", "--hostfile", str(state / "hostfile"),
               "--ssh-config", str(state / "ssh_config"), "--fanout", str(fanout), "--json", "--", "echo", "ok"]
    pdsh = [*netns, "pdsh", "-f", str(fanout), "-w", f"127.0.1.[1-{num_hosts}]", "echo", "ok"]
    pdsh_env = {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {state / 'ssh_config'} -a -x -l%u %h"}
    return {"fstrain": (fstrain, {}), "pdsh": (pdsh, pdsh_env)}


def check_output(name: str, stdout: str, num_hosts: int) -> None:
    """Both tools must really have reached every host, or the timing means nothing."""
    if name == "fstrain":
        hosts = json.loads(stdout)["hosts"]
        ok = sum(h["exit_code"] == 0 and h["stdout"] == "ok\n" for h in hosts)
    else:
        ok = sum(line.endswith(": ok") for line in stdout.splitlines())
    if ok != num_hosts:
        raise RuntimeError(f"{name} reached {ok} of {num_hosts} hosts")


def compare(state: Path, num_hosts: int, rounds: int, fanout: int) -> dict[str, list[float]]:
    cmds = commands(state, num_hosts, fanout)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for name, (argv, env) in cmds.items():  # warm-up: page cache, pyc files, host keys
        check_output(name, time_command(argv, env)[1], num_hosts)
    for round_index in range(rounds):
        order = list(cmds) if round_index % 2 == 0 else list(reversed(cmds))
        for name in order:
            argv, env = cmds[name]
            seconds, stdout = time_command(argv, env)
            check_output(name, stdout, num_hosts)
            times[name].append(seconds)
    return times


def report(times: dict[str, list[float]], args: argparse.Namespace) -> None:
    fstrain, pdsh = median(times["fstrain"]), median(times["pdsh"])
    print(f"machine: {machine_line()}")
    print(f"command: python benchmarks/fanout.py --hosts {args.hosts} --rounds {args.rounds} --fanout {args.fanout}"
          + (" --plain-home" if args.plain_home else ""))
    for name, values in times.items():
        print(f"{name:8s} median {median(values):6.2f} s  runs: {', '.join(f'{v:.2f}' for v in values)}")
    print(f"ratio fstrain/pdsh (median wall time): {fstrain / pdsh:.2f}  (below 1.0: fstrain is faster)")


if __name__ == "__main__":
    sys.exit(main())
