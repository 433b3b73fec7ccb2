"""Writing a render into a directory: content, determinism, refusal, atomicity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fstrain.core.render import TrainingOptions, render_accelerate, render_deepspeed, render_fsdp
from fstrain.errors import ConfigError, InputError
from fstrain.io import render_files
from fstrain.io.render_files import read_plan_file, render_and_write
from tests.plans import make_plan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl-xml"
TOPO = FIXTURES / "SimAI_topo_2A100_1CX6.xml"
TOPO_2 = FIXTURES / "SimAI_topo_4A100_2CX6.xml"
RENDERED = ["README", "accelerate.yaml", "ds_config.json", "fsdp.yaml", "fstrain.env", "plan.yaml"]


def test_writes_every_file_with_the_rendered_content(tmp_path: Path) -> None:
    plan = make_plan("fsdp-hybrid", dp=4, shard_group_size=2, activation_checkpointing="full")
    options = TrainingOptions(lr=1e-3, warmup_steps=3)
    out = tmp_path / "render"
    _, paths = render_and_write(plan, out, force=False, ifname="eth0", rdma_devices=["mlx5_0"],
                                nccl_topo_files=[TOPO], options=options)
    assert [p.name for p in paths] == sorted([*RENDERED, TOPO.name])
    assert sorted(p.name for p in out.iterdir()) == sorted([*RENDERED, TOPO.name])
    assert json.loads((out / "ds_config.json").read_text()) == render_deepspeed(plan, options).config
    assert yaml.safe_load((out / "fsdp.yaml").read_text()) == render_fsdp(plan, options).config
    assert yaml.safe_load((out / "accelerate.yaml").read_text()) == render_accelerate(plan).config
    assert read_plan_file(out / "plan.yaml") == plan
    assert (out / TOPO.name).read_bytes() == TOPO.read_bytes()
    env = (out / "fstrain.env").read_text()
    assert f"NCCL_TOPO_FILE={out.absolute() / TOPO.name}\n" in env
    assert "NCCL_SOCKET_IFNAME=eth0\n" in env and "NCCL_IB_HCA==mlx5_0\n" in env
    readme = (out / "README").read_text()
    for name in [*RENDERED, TOPO.name]:
        if name != "README":
            assert name in readme
    assert "fsdp.yaml is the primary file" in readme
    for path in paths:
        text = path.read_text()
        assert text.endswith("\n") and not text.endswith("\n\n")


def test_output_is_byte_identical_and_sorted(tmp_path: Path) -> None:
    plan = make_plan("zero3", offload="optimizer")
    render_and_write(plan, tmp_path / "a", force=False)
    render_and_write(plan, tmp_path / "b", force=False)
    for name in RENDERED:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    ds_text = (tmp_path / "a" / "ds_config.json").read_text()
    assert ds_text == json.dumps(json.loads(ds_text), indent=2, sort_keys=True) + "\n"
    keys = [line.split(":")[0] for line in (tmp_path / "a" / "fsdp.yaml").read_text().splitlines()
            if line and not line.startswith(" ") and not line.startswith("-")]
    assert keys == sorted(keys)


def test_a_non_empty_directory_is_refused_and_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(InputError, match=r"not empty \(notes.txt\).*--force"):
        render_and_write(make_plan(), out, force=False)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directory left


def test_an_empty_directory_is_used(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    render_and_write(make_plan(), out, force=False)
    assert sorted(p.name for p in out.iterdir()) == RENDERED


def test_force_replaces_rendered_files_and_keeps_others(tmp_path: Path) -> None:
    out = tmp_path / "out"
    render_and_write(make_plan("zero1"), out, force=False)
    (out / "notes.txt").write_text("mine\n")
    render_and_write(make_plan("zero3"), out, force=True)
    assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    assert (out / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        render_and_write(make_plan(), tmp_path / "out", force=True)


def test_a_failed_write_leaves_nothing_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = render_files._write_synced
    calls = []

    def failing_write(path: Path, content: bytes) -> None:
        calls.append(path.name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_write(path, content)

    monkeypatch.setattr(render_files, "_write_synced", failing_write)
    with pytest.raises(OSError, match="No space"):
        render_and_write(make_plan(), tmp_path / "new", force=False)
    assert list(tmp_path.iterdir()) == []  # neither the directory nor a staging copy

    existing = tmp_path / "existing"
    monkeypatch.setattr(render_files, "_write_synced", real_write)
    render_and_write(make_plan("zero1"), existing, force=False)
    before = {p.name: p.read_bytes() for p in existing.iterdir()}
    calls.clear()
    monkeypatch.setattr(render_files, "_write_synced", failing_write)
    with pytest.raises(OSError):
        render_and_write(make_plan("zero3"), existing, force=True)
    assert {p.name: p.read_bytes() for p in existing.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]


def test_two_topology_files_are_copied_without_a_global_topo_variable(tmp_path: Path) -> None:
    bundle, _ = render_and_write(make_plan(), tmp_path / "out", force=False, nccl_topo_files=[TOPO, TOPO_2])
    assert bundle.topo_files == (TOPO.name, TOPO_2.name)
    assert "NCCL_TOPO_FILE" not in (tmp_path / "out" / "fstrain.env").read_text()
    assert "each node shape has its own XML" in (tmp_path / "out" / "README").read_text()


def test_bad_topology_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read NCCL topology file"):
        render_and_write(make_plan(), tmp_path / "a", force=False, nccl_topo_files=[tmp_path / "missing.xml"])
    clash = tmp_path / "README"
    clash.write_text("<system/>")
    with pytest.raises(ConfigError, match="clash"):
        render_and_write(make_plan(), tmp_path / "b", force=False, nccl_topo_files=[clash])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("model: {}\n", "not an fstrain plan"),
        ("- 1\n- 2\n", "not an fstrain plan"),
        ("fstrain_plan: 1\nmodel: [\n", r"plan.yaml:3: not valid YAML"),
    ],
)
def test_read_plan_file_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        read_plan_file(path)


def test_read_plan_file_refuses_a_stage_deepspeed_does_not_have(tmp_path: Path) -> None:
    out = tmp_path / "out"
    render_and_write(make_plan("zero3"), out, force=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text((out / "plan.yaml").read_text().replace("zero_stage: 3", "zero_stage: 5"))
    with pytest.raises(InputError, match="zero_stage is 5"):
        read_plan_file(bad)
    with pytest.raises(InputError, match="file not found"):
        read_plan_file(tmp_path / "nope.yaml")
