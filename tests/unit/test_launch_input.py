"""`fstrain launch` input checks and messages, through the real command line with --dry-run
(no connection is opened)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fstrain.core.job.nested import nested_launcher
from tests.helpers import REPO, python_without, require_tool, run_fstrain

DRY = ("launch", "--dry-run", "--hosts", "nodeA,nodeB", "--nproc-per-node", "1")


def test_env_name_alone_takes_the_value_from_here_and_masks_secrets() -> None:
    secret = "tok-5f2a9c-from-the-environment"
    result = run_fstrain(*DRY, "--env", "WANDB_API_KEY", "--env", "PLAIN_SETTING", "--", "python3", "train.py",
                         env={"WANDB_API_KEY": secret, "PLAIN_SETTING": "kept"})
    assert result.returncode == 0, result.stderr
    assert "WANDB_API_KEY='****'" in result.stdout and "PLAIN_SETTING=kept" in result.stdout
    assert secret not in result.stdout + result.stderr


@pytest.mark.parametrize("backend", ["direct", "deepspeed"])
def test_worker_group_restarts_without_torchrun_are_one_clear_line(backend: str) -> None:
    result = run_fstrain(*DRY, "--backend", backend, "--max-restarts", "2", "--", "python3", "train.py")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: --max-restarts: --max-restarts without --on-failure restart/exclude "
                                     f"restarts torchrun's worker group, and the {backend} backend has none")
    assert "add --on-failure restart" in result.stderr and result.stderr.count("\n") <= 2
    fine = run_fstrain(*DRY, "--backend", backend, "--max-restarts", "2", "--on-failure", "restart", "--",
                       "python3", "train.py")
    assert fine.returncode == 0, fine.stderr


def test_env_name_not_set_here_is_one_clear_line() -> None:
    result = run_fstrain(*DRY, "--env", "FSTRAIN_TEST_NOT_SET_ANYWHERE", "--", "python3", "train.py")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --env: 'FSTRAIN_TEST_NOT_SET_ANYWHERE' is not set in this environment")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(("program", "launcher"), [
    (["torchrun", "--nproc-per-node", "2", "train.py"], "torchrun"),
    (["/opt/venv/bin/torchrun", "train.py"], "torchrun"),
    (["python", "-m", "torch.distributed.run", "train.py"], "torchrun"),
    (["python3", "-u", "-m", "torch.distributed.launch", "train.py"], "torchrun"),
    (["deepspeed", "train.py"], "deepspeed"),
    (["python3", "-m", "deepspeed.launcher.runner", "train.py"], "deepspeed"),
    (["accelerate", "launch", "train.py"], "accelerate launch"),
])
def test_a_launcher_inside_the_launcher_is_refused_with_what_to_run(program: list[str], launcher: str) -> None:
    assert nested_launcher(program) == launcher
    result = run_fstrain(*DRY, "--", *program)
    assert result.returncode == 2
    assert f"the program is itself a launcher ({launcher})" in result.stderr
    assert "fstrain launch --hostfile HOSTS --nproc-per-node N" in result.stderr
    assert ("--backend deepspeed" in result.stderr) == (launcher == "deepspeed")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("program", [
    ["python3", "train.py", "-m", "torch.distributed.run"],  # the script's own arguments
    ["python3", "-m", "mypkg.train", "--launcher", "torchrun"],
    ["accelerate", "config"],
    ["./torchrun_wrapper.sh"],
])
def test_programs_that_merely_mention_a_launcher_are_not_refused(program: list[str]) -> None:
    assert nested_launcher(program) is None


def test_counts_are_singular_when_one_and_placeholders_are_not_printed() -> None:
    result = run_fstrain(*DRY, "--model", "tiny")
    assert result.returncode == 0, result.stderr
    assert "# node 0: nodeA (1 process)" in result.stdout
    assert "{run_dir}" not in result.stderr
    assert "configs rendered into each node's run directory at launch" in " ".join(result.stderr.split())


def test_launch_says_it_falls_back_to_localhost() -> None:
    result = run_fstrain("launch", "--dry-run", "--nproc-per-node", "2", "--", "python3", "train.py")
    assert result.returncode == 0, result.stderr
    assert "hosts: localhost (no --hostfile or --hosts given)" in result.stderr
    assert "# node 0: localhost (2 processes)" in result.stdout


def test_run_dir_placeholder_and_its_escape() -> None:
    from fstrain.io.remote.watchdog import expand

    assert expand("--out={run_dir}/x", "/r") == "--out=/r/x"
    assert expand("{{run_dir}}", "/r") == "{run_dir}"
    assert expand("a{{run_dir}}b{run_dir}c", "/r") == "a{run_dir}b/rc"
    assert expand("{run_dir", "/r") == "{run_dir"


def test_env_name_alone_must_be_a_valid_name() -> None:
    result = run_fstrain(*DRY, "--env", "not a name", "--", "python3", "train.py")
    assert result.returncode == 2
    assert "'not a name' is not a valid environment variable name" in result.stderr


def test_preflight_error_carries_one_hint_the_transports() -> None:
    """An unreachable host's own hint (from the transport) is the error's only hint."""
    import json as _json

    from fstrain.core.hosts.hostfile import Host
    from fstrain.errors import FstrainError, TransportError
    from fstrain.io.fanout import HostPool
    from fstrain.io.hostcheck import preflight
    from fstrain.io.transport import CommandResult, FakeTransport

    info = _json.dumps({"workdir_exists": True, "python": "3.11", "python_executable": "/usr/bin/python3"})

    def connect(host: Host) -> FakeTransport:
        if host.name == "b":
            raise TransportError("b:22: connection refused", "start sshd on b, or leave it out with --exclude")
        return FakeTransport(host.name, lambda argv, stdin: CommandResult(0, info, "", 0.1))

    with HostPool([Host("a"), Host("b")], connect) as pool, pytest.raises(FstrainError) as caught:
        preflight(pool, "python3", "/tmp")
    line = str(caught.value)
    assert line.count("(hint:") == 1, line
    assert "b: b:22: connection refused" in line
    assert line.endswith("(hint: start sshd on b, or leave it out with --exclude)"), line


def test_an_alias_and_its_address_are_refused_before_any_connection(tmp_path: Path) -> None:
    require_tool("ssh", "apt-get install openssh-client")
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu-a\n    HostName 198.18.0.250\n    ConnectTimeout 1\n")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu-a slots=1\n198.18.0.251 slots=1\n198.18.0.250:22 slots=1\n")
    result = run_fstrain("launch", "--hostfile", str(hostfile), "--ssh-config", str(config), "--run-dir",
                         str(tmp_path / "run"), "--", "python3", "train.py", env={"HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"error: {hostfile}:3: duplicate host '198.18.0.250:22': the same machine as 'gpu-a' at {hostfile}:1 "
        "(198.18.0.250, port 22 after the SSH config) (hint: list each machine once and raise its slots instead)\n")
    assert not (tmp_path / "run").exists()


def test_a_package_is_importable_from_the_working_directory_the_ranks_start_in(tmp_path: Path) -> None:
    """`python -m pkg` finds what its working directory holds; metadata alone is not enough."""
    from fstrain.io.remote.netcheck import importable_from

    assert importable_from("fstrain_no_such_package", str(tmp_path)) is None
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    assert importable_from("mypkg", str(tmp_path)) == str(tmp_path / "mypkg")
    assert importable_from("mypkg", str(tmp_path / "elsewhere")) is None


def test_preflight_of_the_bundled_trainer_names_the_hosts_without_fstrain() -> None:
    import json as _json

    from fstrain.api.launch import rank_packages
    from fstrain.core.hosts.hostfile import Host
    from fstrain.errors import FstrainError
    from fstrain.io.fanout import HostPool
    from fstrain.io.hostcheck import BUNDLED_TRAINER_HINT, preflight
    from fstrain.io.transport import CommandResult, FakeTransport

    def connect(host: Host) -> FakeTransport:
        found = {"a": "/srv/fstrain/fstrain", "b": None}[host.name]
        info = _json.dumps({"workdir_exists": True, "python": "3.11", "python_executable": "/usr/bin/python3",
                            "torch": "2.13.0", "fstrain": found})
        return FakeTransport(host.name, lambda argv, stdin: CommandResult(0, info, "", 0.1))

    assert rank_packages("fsdp", True) == ("torch", "fstrain")
    assert rank_packages("deepspeed", False) == ("torch", "deepspeed")
    with HostPool([Host("a"), Host("b")], connect) as pool:
        assert len(preflight(pool, "python3", "/tmp", packages=("torch",))) == 2  # a program of the user's
        with pytest.raises(FstrainError) as caught:
            preflight(pool, "python3", "/tmp", packages=rank_packages("fsdp", True))
    line = str(caught.value)
    assert "b: python3 (/usr/bin/python3, Python 3.11) cannot import fstrain" in line and "a: " not in line
    assert line.endswith(f"(hint: {BUNDLED_TRAINER_HINT})"), line


def test_dry_run_opens_no_connection(tmp_path: Path) -> None:
    result = run_fstrain("launch", "--dry-run", "--hosts", "nosuchhost[1-2].invalid", "--nproc-per-node", "2",
                         "--backend", "deepspeed", "--", "python3", "train.py", "--lr", "0.1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "# node 0: nosuchhost1.invalid (2 processes)"
    assert lines[1] == "PYTHONUNBUFFERED=1"
    assert "-m deepspeed.launcher.launch" in lines[2] and "--node_rank=0" in lines[2]
    assert lines[2].endswith("train.py --lr 0.1")
    assert lines[5].startswith("python3 -u -m deepspeed.launcher.launch") and "--node_rank=1" in lines[5]


def test_tensorboard_is_checked_by_the_preflight_where_the_launch_writes_events(tmp_path: Path) -> None:
    """--tensorboard: what the trainer's writer imports is one of the packages every host's
    interpreter must import, checked for real (netcheck through the local transport)."""
    from fstrain.api.launch import rank_packages
    from fstrain.core.hosts.hostfile import Host
    from fstrain.errors import FstrainError
    from fstrain.io.fanout import HostPool
    from fstrain.io.hostcheck import preflight
    from fstrain.io.transport.local import LocalTransport
    from tests.helpers import REPO

    packages = rank_packages("torchrun", True, tensorboard=True)
    assert packages == ("torch", "fstrain", "tensorboard")
    assert "tensorboard" not in rank_packages("torchrun", True)

    def connect(host: Host) -> LocalTransport:
        return LocalTransport(host.name)

    with HostPool([Host("localhost")], connect) as pool:
        # This interpreter has it (fstrain[test]): the check passes.
        assert len(preflight(pool, sys.executable, str(REPO), packages=packages)) == 1
        without = python_without(tmp_path, "tensorboard")
        with pytest.raises(FstrainError) as caught:
            preflight(pool, without, str(REPO), packages=packages)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"launch: preflight failed on localhost: {without} ("), line
    assert line.count("cannot import") == 1 and "cannot import tensorboard (hint:" in line, line
    assert f"{without} -m pip install tensorboard on those hosts" in line and "leave out --tensorboard" in line


def test_a_preflight_failing_on_many_hosts_names_five_and_folds_the_rest() -> None:
    from fstrain.io.hostcheck import summarize_problems

    problems = [f"node{i}: cannot resolve 'node{i}': Name or service not known" for i in range(1, 201)]
    line = summarize_problems(problems)
    assert line == ("; ".join(problems[:5]) + "; and 195 more hosts (node[6-200])")
    assert summarize_problems(problems[:5]) == "; ".join(problems[:5])


def test_a_model_the_bundled_trainer_cannot_build_is_refused_before_any_host(tmp_path: Path) -> None:
    """Mistral's sliding window is planned, but the bundled trainer does not build it: `launch
    --recipe config.json` says so in one line before contacting a host (it used to start every
    rank, each of which refused); with a PROGRAM, the user's own trainer runs it, and the same
    recipe goes on (a dry run: nothing is contacted)."""
    config = REPO / "tests" / "fixtures" / "hf-configs" / "Mistral-7B-v0.1" / "config.json"
    env = {"HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    refused = run_fstrain("launch", "--hosts", "nowhere.invalid", "--recipe", str(config), "--run-dir",
                          str(tmp_path / "run"), env=env)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("error: model.sliding_window: model 'Mistral-7B-v0.1' has sliding-window "
                                     "attention, which the reference trainer does not build (hint: "), refused.stderr
    assert not (tmp_path / "run").exists()
    own = run_fstrain("launch", "--dry-run", "--hosts", "nowhere.invalid", "--nproc-per-node", "1", "--recipe",
                      str(config), "--run-dir", str(tmp_path / "run"), "--", "python3", "train.py", env=env)
    assert own.returncode == 0 and "dry run: nothing was contacted" in own.stderr, own.stderr


def test_the_reachability_checks_limit_grows_with_how_slow_the_hosts_answered() -> None:
    import json as _json
    import time as _time

    from fstrain.core.hosts.hostfile import Host
    from fstrain.io.fanout import HostPool
    from fstrain.io.hostcheck import CHECK_MARGIN_S, check_timeout_s, preflight
    from fstrain.io.launch import HostFacts
    from fstrain.io.transport import CommandResult, FakeTransport

    info = _json.dumps({"workdir_exists": True, "python": "3.11", "python_executable": "/usr/bin/python3"})

    def answer(name: str) -> CommandResult:
        _time.sleep(0.3 if name == "b" else 0.0)  # b's login shell and Python start-up, under load
        return CommandResult(0, info, "", 0.0)

    with HostPool([Host("a"), Host("b")], lambda host: FakeTransport(host.name, lambda argv, stdin: answer(
            host.name))) as pool:
        facts = preflight(pool, "python3", "/tmp")
    assert facts[0].session_s < 0.3 <= facts[1].session_s < 5  # each host's session as this machine timed it
    assert check_timeout_s(5, 2, facts) == 10 + CHECK_MARGIN_S  # quick hosts: the margin
    busy = [HostFacts(Host("a"), {}, 0.2), HostFacts(Host("b"), {}, 41.0)]
    assert check_timeout_s(5, 1, busy) == 5 + 82.0  # twice the slowest session, past the margin
