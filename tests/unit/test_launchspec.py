"""The pure half of `fstrain launch`: per-node commands, environment, masking, plans."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from fstrain.core.hosts.hostfile import Host, parse_hostfile, select_hosts
from fstrain.core.job.plan import check_plan_fits_launch, data_parallel_plan, trainer_program
from fstrain.core.job.spec import (
    DEFAULT_ENV,
    DIRECT_SCRIPT,
    PORT_RANGE,
    LaunchJob,
    base_env,
    deepspeed_argv,
    launcher_prefix,
    mask_env,
    master_port_candidates,
    parse_env_file,
    plan_launches,
    redact,
    resolve_nproc,
    secret_values,
    torchrun_argv,
)
from fstrain.core.plan.schema import ClusterSummary
from fstrain.errors import ConfigError, InputError
from tests.plans import make_plan


def test_secret_names_are_masked_and_values_redacted() -> None:
    env = {"HF_TOKEN": "hf_abcdef", "aws_secret_access_key": "AKIAxyz", "DB_PASSWORD": "pw12", "A": "1",
           "MY_KEY": "k"}
    assert mask_env(env) == {"HF_TOKEN": "****", "aws_secret_access_key": "****", "DB_PASSWORD": "****",
                             "A": "1", "MY_KEY": "****"}
    secrets = secret_values(env)
    assert secrets == ["hf_abcdef", "AKIAxyz", "pw12"]  # longest first; too short to redact: "k"
    assert redact("token=hf_abcdef pw=pw12 a=1", secrets) == "token=**** pw=**** a=1"


def test_env_file_forms_and_errors() -> None:
    text = "# comment\n\nexport A=1\nB='two words'\nC=\"x=y\"\nD=\n"
    assert parse_env_file(text, "f") == {"A": "1", "B": "two words", "C": "x=y", "D": ""}
    with pytest.raises(InputError, match="f:2: expected NAME=VALUE, got 'NOVALUE'"):
        parse_env_file("A=1\nNOVALUE\n", "f")
    with pytest.raises(InputError, match="f:1: '1BAD' is not a valid environment variable name"):
        parse_env_file("1BAD=x\n", "f")


def test_master_port_is_stable_per_run_and_differs_between_runs() -> None:
    first = master_port_candidates("20261129-120000-aaaaaa")
    assert first == master_port_candidates("20261129-120000-aaaaaa")
    assert first[0] != master_port_candidates("20261129-120000-bbbbbb")[0]
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] for p in first) and len(set(first)) == 16


def test_nproc_from_flag_slots_or_gpus() -> None:
    assert resolve_nproc(Host("a", slots=8), 2, None) == 2
    assert resolve_nproc(Host("a", slots=8, slot_ids=(0, 3)), None, None) == 2
    assert resolve_nproc(Host("a"), None, 4) == 4
    with pytest.raises(ConfigError, match="no slots in the inventory and no GPU found"):
        resolve_nproc(Host("a"), None, 0)
    with pytest.raises(InputError, match="must be 1 or more"):
        resolve_nproc(Host("a"), 0, None)


def job(program: Sequence[str] = ("t.py",), **changes: Any) -> LaunchJob:
    """A launch job with every field given; ``changes`` replace some."""
    fields: dict[str, Any] = {"backend": "torchrun", "program": tuple(program), "python": "python3",
                              "master_addr": "10.0.0.1", "master_port": 29500, "run_id": "r1", "max_restarts": 2}
    return LaunchJob(**{**fields, **changes})


def torchrun(program: Sequence[str], **changes: Any) -> tuple[str, ...]:
    return torchrun_argv(job(program, **changes), nnodes=2, node_rank=1, nproc=4)


def test_torchrun_argv_maps_programs() -> None:
    argv = torchrun(["python3", "train.py", "--lr", "1"])
    assert argv[:3] == ("python3", "-m", "torch.distributed.run")
    assert "--rdzv-endpoint=10.0.0.1:29500" in argv and "--rdzv-id=r1" in argv and "--max-restarts=2" in argv
    assert argv[-3:] == ("train.py", "--lr", "1")
    assert torchrun(["python", "-m", "pkg.mod", "x"])[-3:] == ("-m", "pkg.mod", "x")
    assert torchrun(["./run.sh", "a"])[-3:] == ("--no-python", "./run.sh", "a")
    assert torchrun(["python3", "-c", "pass"])[-4:] == ("--no-python", "python3", "-c", "pass")
    v6 = torchrun(["t.py"], master_addr="fd00::1")
    assert "--rdzv-endpoint=[fd00::1]:29500" in v6


def test_torchrun_without_restarts_uses_the_static_rendezvous_and_knows_global_ranks() -> None:
    argv = torchrun(["train.py"], max_restarts=0)
    assert "--rdzv-backend=static" in argv and "--node-rank=1" in argv
    assert "--master-addr=10.0.0.1" in argv and "--master-port=29500" in argv
    assert not any(a.startswith("--rdzv-endpoint") for a in argv)
    hosts = [Host("a"), Host("b"), Host("c")]
    static = plan_launches(hosts, [2, 3, 2], job(["python3", "t.py"], max_restarts=0))
    assert [n.rank_offset for n in static] == [0, 2, 5]
    elastic = plan_launches(hosts, [2, 3, 2], job(["python3", "t.py"], max_restarts=1))
    assert [n.rank_offset for n in elastic] == [None, None, None]  # c10d assigns ranks at the rendezvous
    deepspeed = plan_launches(hosts, [2, 2, 2], job(["python3", "t.py"], backend="deepspeed", max_restarts=1))
    assert [n.rank_offset for n in deepspeed] == [0, 2, 4] and deepspeed[0].backend == "deepspeed"


def test_direct_backend_runs_fstrains_script_with_every_nodes_ranks_known() -> None:
    hosts = [Host("a"), Host("b", slot_ids=(1, 3)), Host("c")]
    launches = plan_launches(hosts, [2, 2, 3], job(["python", "train.py", "--lr", "1"], backend="direct",
                                                  python="/venv/bin/python", max_restarts=2))
    assert [n.rank_offset for n in launches] == [0, 2, 4]  # fixed before the start, whatever --max-restarts
    second = launches[1]
    assert second.argv[:4] == ("/venv/bin/python", "-S", "-u", "{run_dir}/" + DIRECT_SCRIPT)
    for option in ("--nnodes=3", "--node-rank=1", "--nproc=2", "--rank-offset=2", "--world-size=7",
                   "--master-addr=10.0.0.1", "--master-port=29500", "--run-id=r1", f"--log-dir={second.rank_log_dir}"):
        assert option in second.argv, option
    # The program after --, its Python replaced by the hosts' interpreter, as torchrun runs it.
    assert second.argv[second.argv.index("--") + 1:] == ("/venv/bin/python", "train.py", "--lr", "1")
    assert second.env["CUDA_VISIBLE_DEVICES"] == "1,3" and "CUDA_VISIBLE_DEVICES" not in launches[0].env
    tail = plan_launches([Host("a")], [1], job(["t.py", "x"], backend="direct", python="p"))[0].argv
    assert tail[tail.index("--") + 1:] == ("p", "t.py", "x")
    tail = plan_launches([Host("a")], [1], job(["./run.sh", "x"], backend="direct", python="p"))[0].argv
    assert tail[tail.index("--") + 1:] == ("./run.sh", "x")


def test_deepspeed_argv_carries_world_info() -> None:
    argv = deepspeed_argv("python3", world_info={"a": [0, 1], "b": [2]}, node_rank=1, master_addr="a",
                          master_port=1234, program=["python3", "-m", "fstrain.train", "--steps", "2"])
    encoded = next(a for a in argv if a.startswith("--world_info=")).split("=", 1)[1]
    assert json.loads(base64.urlsafe_b64decode(encoded)) == {"a": [0, 1], "b": [2]}
    # As the deepspeed command: --local_rank=N is appended unless asked not to.
    assert "--node_rank=1" in argv and "--no_local_rank" not in argv
    assert argv[-4:] == ("--module", "fstrain.train", "--steps", "2")
    quiet = deepspeed_argv("python3", world_info={"a": [0]}, node_rank=0, master_addr="a", master_port=1,
                           program=["python3", "t.py"], no_local_rank=True)
    assert "--no_local_rank" in quiet and quiet[-1] == "t.py"
    assert deepspeed_argv("python3", world_info={}, node_rank=0, master_addr="a", master_port=1,
                          program=["./run.sh"])[-2:] == ("--no_python", "./run.sh")


def test_deepspeed_world_info_is_refused_where_it_no_longer_fits_one_argument() -> None:
    # 52 bytes a node of 8 slots ('node00001' names): 2,400 nodes fit in 131,072, 2,600 do not.
    fits = plan_launches([Host(f"node{i:05d}") for i in range(2400)], [8] * 2400,
                         job(["python3", "t.py"], backend="deepspeed"))
    arg = next(a for a in fits[-1].argv if a.startswith("--world_info="))
    assert len(arg) < 131072 and arg == next(a for a in fits[0].argv if a.startswith("--world_info="))
    with pytest.raises(InputError) as refused:
        plan_launches([Host(f"node{i:05d}") for i in range(2600)], [8] * 2600,
                      job(["python3", "t.py"], backend="deepspeed"))
    assert "for 2,600 nodes is 135,2" in refused.value.message and "MAX_ARG_STRLEN" in refused.value.message
    assert "--backend torchrun" in refused.value.hint
    assert len(plan_launches([Host(f"node{i:05d}") for i in range(2600)], [8] * 2600,
                             job(["python3", "t.py"]))) == 2600  # torchrun's command line does not grow


def test_plan_launches_env_precedence_and_selected_slots() -> None:
    hosts = select_hosts(parse_hostfile("a slots=4\nb slots=4\n", "hf"), include="a:1,3@b")
    launches = plan_launches(hosts, [2, 4], job(["python3", "t.py"], max_restarts=0,
                                                env={"NCCL_SOCKET_IFNAME": "ib0", "PYTHONUNBUFFERED": "0"}),
                             [{"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"},
                              {"GLOO_SOCKET_IFNAME": "eth1"}])
    assert launches[0].env == {"PYTHONUNBUFFERED": "0", "NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "eth0",
                               "CUDA_VISIBLE_DEVICES": "1,3"}
    assert launches[1].env == {"PYTHONUNBUFFERED": "0", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "ib0"}
    defaults = plan_launches(hosts, [2, 4], job(["t.py"], python="p", max_restarts=0))
    assert defaults[1].env == DEFAULT_ENV
    assert [launch.nproc for launch in launches] == [2, 4]
    ds = plan_launches(hosts, [2, 4], job(["t.py"], backend="deepspeed", max_restarts=0))
    encoded = next(a for a in ds[0].argv if a.startswith("--world_info=")).split("=", 1)[1]
    assert json.loads(base64.urlsafe_b64decode(encoded)) == {"a": [1, 3], "b": [0, 1, 2, 3]}
    with pytest.raises(InputError, match="unknown backend"):
        plan_launches(hosts, [2, 4], job(["t.py"], backend="mpirun"))


@pytest.mark.parametrize("backend", ["torchrun", "deepspeed"])
@pytest.mark.parametrize("max_restarts", [0, 2])
def test_every_node_command_starts_with_the_prefix_a_watchdog_prewarms(backend: str, max_restarts: int) -> None:
    # A prewarmed watchdog runs its launcher only when the final command has this prefix, and
    # its Python starts with base_env: each node's environment adds only the interface variables.
    hosts = parse_hostfile("a slots=2\nb slots=2\n", "hf")
    user = {"PYTHONPATH": "/x", "TOKEN": "s"}
    launches = plan_launches(hosts, [2, 2], job(["python3", "-m", "pkg.train"], backend=backend,
                                                python="/venv/bin/python", max_restarts=max_restarts, env=user),
                             [{"GLOO_SOCKET_IFNAME": "eth0"}, {"GLOO_SOCKET_IFNAME": "ib0"}])
    prefix = launcher_prefix(backend, "/venv/bin/python")
    assert prefix[0] == "/venv/bin/python" and prefix[-2] == "-m"
    for launch in launches:
        assert launch.argv[:len(prefix)] == prefix
        assert {k: v for k, v in launch.env.items() if k != "GLOO_SOCKET_IFNAME"} == base_env(user)
    assert base_env(user) == {**DEFAULT_ENV, **user}
    assert base_env({"PYTHONUNBUFFERED": "0"}) == {"PYTHONUNBUFFERED": "0"}


def test_data_parallel_plan_and_world_size_check() -> None:
    spec = make_plan().model
    plan = data_parallel_plan(spec, ClusterSummary(2, 2, "cpu", 0), strategy="fsdp-hybrid",
                              micro_batch_size=3)
    assert (plan.knobs.dp, plan.knobs.shard_group_size, plan.knobs.zero_stage) == (4, 2, 3)
    assert plan.knobs.global_batch_size == 12
    check_plan_fits_launch(plan, 4, "--model")
    with pytest.raises(ConfigError, match=r"dp\(4\) \* tp\(1\) \* pp\(1\) = 4 processes, but this launch starts 6"):
        check_plan_fits_launch(plan, 6, "--plan")
    fused = replace(plan, knobs=replace(plan.knobs, loss="fused"))  # made for another training code's loss
    with pytest.raises(ConfigError, match="re-plan with --loss full"):
        check_plan_fits_launch(fused, 4, "--plan")
    argv = trainer_program("python3", plan, steps=5)
    assert argv[:3] == ["python3", "-m", "fstrain.train"] and "{run_dir}/fsdp.yaml" in argv
    zero = data_parallel_plan(spec, ClusterSummary(1, 2, "cpu", 0), strategy="zero3",
                              micro_batch_size=1)
    assert "{run_dir}/ds_config.json" in trainer_program("python3", zero, steps=5)


@pytest.mark.parametrize(("backend", "option"), [("deepspeed", "--enable_each_rank_log="), ("torchrun", "--log-dir="),
                                                 ("direct", "--log-dir=")])
def test_rank_logs_go_to_a_folder_per_node(backend: str, option: str) -> None:
    """Every rank writes files of its own (the watchdog relays them whole): never torchrun's --tee."""
    hosts = [Host("a", slots=2), Host("b", slots=2)]
    for restarts in (0, 2):
        launches = plan_launches(hosts, [2, 2], job(["t.py"], backend=backend, python="p", max_restarts=restarts))
        assert [n.rank_log_dir for n in launches] == ["{run_dir}/ranklogs/node0", "{run_dir}/ranklogs/node1"]
        for launch in launches:
            assert f"{option}{launch.rank_log_dir}" in launch.argv
            assert ("--redirects=3" in launch.argv) == (backend == "torchrun")
            assert not any(arg.startswith("--tee") for arg in launch.argv)


@pytest.mark.parametrize(
    ("include", "exclude", "requested", "selected"),
    [("worker-0:1", None, 2, "1 slot(s) (1)"), (None, "worker-0:1", 1, "3 slot(s) (0,2,3)")],
)
def test_nproc_per_node_contradicting_slot_filters_is_refused(
    include: str | None, exclude: str | None, requested: int, selected: str
) -> None:
    # DeepSpeed refuses --num_gpus with slot filters: never start N processes on fewer devices.
    host = select_hosts(parse_hostfile("worker-0 slots=4\n", "hf"), include=include, exclude=exclude)[0]
    with pytest.raises(InputError, match=rf"--nproc-per-node {requested} contradicts .*{re.escape(selected)}"):
        resolve_nproc(host, requested, None)
    assert resolve_nproc(host, len(host.slot_ids or ()), None) == len(host.slot_ids or ())  # agreeing is fine
    assert resolve_nproc(host, None, None) == len(host.slot_ids or ())
