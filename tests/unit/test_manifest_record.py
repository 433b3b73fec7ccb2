"""RUN_DIR/manifest.json as a typed record (fstrain/core/runs/manifest.py): what io/launch.py
writes is what io/runs.py reads back, field for field; a file changed by hand or of a newer
format is named in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fstrain import __version__
from fstrain.core.formats import KINDS
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.core.runs.manifest import Manifest, ManifestNode
from fstrain.errors import InputError
from fstrain.io.launch import Rendezvous, RunOutcome, RunSetup, manifest_of, node_summary, write_manifest
from fstrain.io.runs import read_manifest

LAUNCHES = [NodeLaunch(Host("node1"), 0, 2, ("python3", "train.py"), {"HF_TOKEN": "secret", "A": "1"}),
            NodeLaunch(Host("node2"), 1, 2, ("python3", "train.py"))]


def test_a_written_manifest_reads_back_as_the_same_record(tmp_path: Path) -> None:
    setup = RunSetup("20261205-000000-abcdef", "torchrun", LAUNCHES, Rendezvous("node1", 29500, ("eth0", "eth0")),
                     env={"WANDB_API_KEY": "k" * 20})
    outcome = RunOutcome(7, "failed", None, [], 10.0, 20.0, detail="rank 3 exited with 7")
    written = replace(manifest_of(setup, outcome), attempts=({"attempt": 1, "exit_code": 7},),
                      training_summary={"steps": 3})
    write_manifest(tmp_path / "manifest.json", written)
    document = json.loads((tmp_path / "manifest.json").read_text())
    assert document["format"] == KINDS["manifest"].current and document["fstrain"] == __version__
    assert document["env"]["WANDB_API_KEY"] != "k" * 20 and document["nodes"][0]["env"]["HF_TOKEN"] != "secret"
    assert "started" not in document["nodes"][0]  # a node that never ran has no end fields
    read = read_manifest(tmp_path / "manifest.json")
    assert read is not None and read == replace(written, writer=__version__)
    assert (read.master_addr, read.master_port, read.exit_code) == ("node1", 29500, 7)
    assert read.to_dict(read.writer) == document  # the file's document, key for key


def test_a_node_that_ran_keeps_its_end_and_names_the_failed_host() -> None:
    ran = replace(ManifestNode("node2", 1, 2, ("t.py",), {}), started=1.0, ended=2.0, exit_code=7, seconds=1.0,
                  last_lines=("boom",), failed_rank={"rank": 3, "local_rank": 1, "exit_code": 7, "signal": None})
    manifest = Manifest("r", "torchrun", nodes=(node_summary(LAUNCHES[0], None), ran), first_failure_node_rank=1)
    assert manifest.failed_host == "node2"
    assert Manifest.from_dict(manifest.to_dict("1.0"), "m") == replace(manifest, writer="1.0")


@pytest.mark.parametrize(("change", "words"), [
    ({"run_id": ""}, "run_id must be non-empty text"),
    ({"exit_code": "7"}, "exit_code must be an integer"),
    ({"ended": "later"}, "ended must be a number"),
    ({"nodes": {"node1": {}}}, "nodes must be a list"),
    ({"nodes": [{"host": "node1", "node_rank": 0}]}, "nproc is missing"),
    ({"attempts": [1, 2]}, "attempts must be a list of objects"),
])
def test_a_manifest_changed_by_hand_is_named_in_one_line(tmp_path: Path, change: dict, words: str) -> None:
    path = tmp_path / "manifest.json"
    write_manifest(path, Manifest("r1", "torchrun", nodes=(node_summary(LAUNCHES[1], None),)))
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(InputError) as raised:
        read_manifest(path)
    assert words in raised.value.message and raised.value.where == str(path) and raised.value.hint


def test_a_newer_manifest_is_refused_and_a_missing_one_is_none(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    assert read_manifest(path) is None
    path.write_text(json.dumps({"format": KINDS["manifest"].current + 1, "fstrain": "9.9.0", "run_id": "r"}))
    with pytest.raises(InputError, match=r"written by fstrain 9\.9\.0"):
        read_manifest(path)
