"""Write a render bundle into a directory, deterministically and without half-written results.

Files are serialized with sorted keys and a trailing newline, so two renders of the same plan
are byte-identical and can be diffed and committed. A new directory is written as a temporary
sibling and renamed into place; an existing one (empty, or with ``force``) gets each file
replaced atomically with ``os.replace``, so a failure never leaves a truncated file and never
removes anything already there.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render.bundle import (
    ACCELERATE_CONFIG,
    DS_CONFIG,
    ENV_FILE,
    FSDP_CONFIG,
    HF_ARGS,
    HF_DS_CONFIG,
    LIGHTNING_CONFIG,
    PLAN_FILE,
    README,
    RENDERED_FILES,
    TORCHTITAN_ARGS,
    RenderBundle,
    render_bundle,
)
from fstrain.core.render.env import format_env_file
from fstrain.core.render.options import TrainingOptions
from fstrain.errors import ConfigError, InputError
from fstrain.io.userfiles import MAX_FILE_BYTES, load_yaml, read_text_bounded


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def to_yaml(data: Any) -> str:
    text: str = yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
    return text


def bundle_files(bundle: RenderBundle) -> dict[str, bytes]:
    """File name -> content for everything but the NCCL XML copies (no ds_config.json for a plan
    DeepSpeed cannot run; a trainer's files only when it was asked for)."""
    files = {
        ACCELERATE_CONFIG: to_yaml(bundle.accelerate).encode(),
        DS_CONFIG: to_json(bundle.deepspeed).encode(),
        ENV_FILE: format_env_file(bundle.env).encode(),
        FSDP_CONFIG: to_yaml(bundle.fsdp).encode(),
        PLAN_FILE: to_yaml(bundle.plan).encode(),
        README: bundle.readme.encode(),
    }
    if bundle.deepspeed is None:
        del files[DS_CONFIG]
    if bundle.hf_training_args is not None:
        files[HF_ARGS] = to_json(bundle.hf_training_args).encode()
    if bundle.hf_deepspeed is not None:
        files[HF_DS_CONFIG] = to_json(bundle.hf_deepspeed).encode()
    if bundle.lightning is not None:
        files[LIGHTNING_CONFIG] = to_yaml(bundle.lightning).encode()
    if bundle.torchtitan_args is not None:
        files[TORCHTITAN_ARGS] = "".join(f"{arg}\n" for arg in bundle.torchtitan_args).encode()
    return files


def read_plan_file(path: Path) -> PlanFile:
    """Load ``plan.yaml``; every failure is one InputError naming the file."""
    where = str(path)
    if not path.exists():
        raise InputError("plan file not found", "write a plan with `fstrain plan --out plan.yaml`", where)
    data = load_yaml(read_text_bounded(path, "plan file"), where)
    return PlanFile.from_dict(data, where)


def check_out_dir(out_dir: Path, *, force: bool) -> None:
    """Refuse to write over a file, or into a non-empty directory without ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("exists and is not a directory", "choose another -o DIR", str(out_dir))
    if out_dir.is_dir() and not force:
        present = sorted(entry.name for entry in out_dir.iterdir())
        if present:
            shown = ", ".join(present[:5]) + (", ..." if len(present) > 5 else "")
            raise InputError(
                f"output directory is not empty ({shown})",
                "choose a new directory, or pass --force to replace the rendered files in it",
                str(out_dir),
            )


def write_render(out_dir: Path, files: dict[str, bytes], *, force: bool) -> list[Path]:
    """Write ``files`` into ``out_dir``; returns the written paths, sorted."""
    out_dir = out_dir.absolute()
    check_out_dir(out_dir, force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        for name, content in sorted(files.items()):
            _write_synced(staging / name, content)
        if not out_dir.exists():
            staging.chmod(0o755)  # mkdtemp makes it 0700; a render directory is shared
            os.rename(staging, out_dir)  # atomic: the directory appears complete or not at all
        else:
            for name in sorted(files):
                os.replace(staging / name, out_dir / name)
            # A rendered file this plan has none of (ds_config.json for a cp > 1 plan) would be
            # another plan's: --force replaces the rendered files, so it goes too.
            for name in sorted(set(RENDERED_FILES) - set(files)):
                (out_dir / name).unlink(missing_ok=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return [out_dir / name for name in sorted(files)]


def _write_synced(path: Path, content: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    path.chmod(0o644)


def render_and_write(
    plan: PlanFile,
    out_dir: Path | str,
    *,
    force: bool,
    ifname: str | None = None,
    rdma_devices: Sequence[str] = (),
    nccl_topo_files: Sequence[Path | str] = (),
    debug: bool = False,
    options: TrainingOptions | None = None,
    trainers: Sequence[str] = (),
) -> tuple[RenderBundle, list[Path]]:
    """Render ``plan`` and write it into ``out_dir``; returns the bundle and the written paths."""
    out_path = Path(out_dir).absolute()
    check_out_dir(out_path, force=force)  # before rendering: fail fast, touch nothing
    topo_sources = [Path(p) for p in nccl_topo_files]
    topo_contents: dict[str, bytes] = {}
    for source in topo_sources:
        try:
            if source.is_file() and source.stat().st_size > MAX_FILE_BYTES:
                raise InputError(f"NCCL topology file larger than {MAX_FILE_BYTES // 2**20} MiB",
                                 "is this really an NCCL topology XML?", str(source))
            topo_contents[source.name] = source.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read NCCL topology file: {exc.strerror}", "", str(source)) from None
    if len(topo_contents) != len(topo_sources):
        raise ConfigError("two NCCL topology files have the same name", "rename one of them", "--nccl-topo")
    bundle = render_bundle(
        plan,
        out_dir=str(out_path),
        options=options,
        ifname=ifname,
        rdma_devices=rdma_devices,
        topo_files=[source.name for source in topo_sources],
        debug=debug,
        trainers=trainers,
    )
    files = bundle_files(bundle)
    files.update(topo_contents)
    return bundle, write_render(out_path, files, force=force)

