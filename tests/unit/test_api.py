"""`fstrain.api` on values: the typed requests, the errors the CLI prints, nothing contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from fstrain import api
from fstrain.errors import FstrainError, InputError


def test_plan_ranks_the_tiny_recipe_and_writes_its_plan_file() -> None:
    planned = api.plan(api.PlanRequest(model=api.ModelRequest(model="tiny"),
                                       cluster=api.ClusterRequest(num_nodes=1, gpus_per_node=2, gpu="h100-sxm"),
                                       pins=api.PinRequest(strategy="fsdp-full")))
    best = planned.result.best
    assert best is not None and best.knobs.strategy == "fsdp-full" and best.knobs.dp == 2
    assert planned.plan_file().knobs == best.knobs
    assert planned.batch_note  # where the global batch came from


def test_plan_errors_are_the_clis_one_line_errors() -> None:
    with pytest.raises(InputError, match="give exactly one of --model, --recipe and --model-params"):
        api.plan(api.PlanRequest(cluster=api.ClusterRequest(gpu="h100-sxm")))
    with pytest.raises(FstrainError) as caught:
        api.plan(api.PlanRequest(model=api.ModelRequest(model="tiny"), cluster=api.ClusterRequest(gpu="h100-sxm"),
                                 pins=api.PinRequest(strategy="zero9")))
    assert caught.value.where == "--strategy" and "zero9" in caught.value.one_line()


def test_prepare_checks_before_any_host_is_contacted(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no program to launch"):
        api.prepare(api.LaunchRequest(hosts=api.HostRequest(hosts="a,b")))
    with pytest.raises(InputError, match="unknown backend"):
        api.prepare(api.LaunchRequest(hosts=api.HostRequest(hosts="a"), job=api.JobRequest(program=("x",),
                                                                                         backend="mpi")))
    with pytest.raises(InputError, match="is itself a launcher"):
        api.prepare(api.LaunchRequest(hosts=api.HostRequest(hosts="a"),
                                      job=api.JobRequest(program=("torchrun", "train.py"))))


def test_dry_run_gives_every_nodes_command() -> None:
    prepared = api.prepare(api.LaunchRequest(
        hosts=api.HostRequest(hosts="node[1-2]"),
        job=api.JobRequest(program=("python3", "train.py"), nproc_per_node=4, env={"A": "1"}),
        run=api.RunSettings(run_id="20261201-000000-abcdef", master_port=29500)))
    planned = api.dry_run(prepared)
    assert [launch.host.name for launch in planned.launches] == ["node1", "node2"]
    assert all(launch.nproc == 4 and launch.env["A"] == "1" for launch in planned.launches)
    assert (planned.master_addr, planned.master_port) == ("node1", 29500)
    assert prepared.run_dir == Path("runs") / "20261201-000000-abcdef"


def test_runs_lists_nothing_on_a_fresh_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert api.runs() == []
    with pytest.raises(InputError):
        api.open_run("20261201")


def test_logs_are_one_line_per_item_for_every_kind_of_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Run.logs()`: the same shape whatever the run (one item per line, each ending with a
    newline), in the documented order: an attached or Slurm run's files one after the other
    (hosts by name), a detached run's nodes merged by time."""
    import time

    from fstrain.api.runs import Run
    from fstrain.core.runs.runrecord import SlurmRecord
    from fstrain.io.runs import RunRecord
    from tests.unit.test_cli_runs import attached_run, detached_run

    attached_run(tmp_path / "home", tmp_path / "a", "20261201-100000-aaaaaa", "ok", 0, monkeypatch)
    (tmp_path / "a" / "logs" / "node2.log").write_text("[node2 r2] third\n[node2 r3] fourth\n")
    attached = api.open_run("20261201-100000-aaaaaa")
    assert attached.kind == "attached"
    assert attached.logs() == ["[localhost r0] hello\n", "[localhost r1] world\n", "[node2 r2] third\n",
                               "[node2 r3] fourth\n"]
    assert attached.logs(tail=3) == ["[localhost r1] world\n", "[node2 r2] third\n", "[node2 r3] fourth\n"]
    assert attached.logs(hosts=["node2"]) == ["[node2 r2] third\n", "[node2 r3] fourth\n"]

    job = tmp_path / "s" / "job-42" / "logs"
    job.mkdir(parents=True)
    (tmp_path / "s" / "slurm-42.out").write_text("[node1 r0] hello\n[node2 r1] world\nfstrain: run ended\n")
    (job / "node1.log").write_text("[node1 r0] hello\n[node1 r0] again\n")
    slurm = Run(RunRecord("20261201-110000-bbbbbb", tmp_path / "s", None, None, None,
                          SlurmRecord("20261201-110000-bbbbbb", "42", time.time(),
                                      output=str(tmp_path / "s" / "slurm-42.out"))))
    assert slurm.kind == "slurm"
    assert slurm.logs() == ["[node1 r0] hello\n", "[node2 r1] world\n", "fstrain: run ended\n"]
    assert slurm.logs(tail=2, hosts=["node1"]) == ["[node1 r0] hello\n", "[node1 r0] again\n"]

    node0 = tmp_path / "node0"
    node0.mkdir()
    (node0 / "node0.out").write_text("10.000 [default0]:first\n12.000 [default1]:second\n")
    detached_run(tmp_path / "home", tmp_path / "d", "20261201-120000-cccccc", [{"name": "localhost"}], [node0],
                 monkeypatch)
    detached = api.open_run("20261201-120000-cccccc")
    assert detached.kind == "detached"
    assert detached.logs() == ["[localhost r0] first\n", "[localhost r1] second\n"]
