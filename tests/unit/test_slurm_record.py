"""RUN_DIR/slurm.json as a typed record: written and read back, an older file read, a broken one
named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fstrain.core.runs.runrecord import SlurmRecord
from fstrain.errors import InputError
from fstrain.io.runs import SLURM_RECORD, read_slurm, write_slurm


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    claimed = SlurmRecord("r1", None, 100.0)  # before sbatch answered
    submitted = SlurmRecord("r1", "42", 101.0, "/runs/r1/sbatch.sh", "/runs/r1/slurm-42.out", 15.0, 130.5)
    for record in (claimed, submitted):
        write_slurm(tmp_path / SLURM_RECORD, record)
        assert read_slurm(tmp_path / SLURM_RECORD) == record
    assert read_slurm(tmp_path / "none.json") is None


def test_an_older_file_and_a_broken_one(tmp_path: Path) -> None:
    path = tmp_path / SLURM_RECORD
    path.write_text(json.dumps({"format": 1, "fstrain": "0.1.0", "kind": "slurm", "run_id": "r1", "job_id": 7,
                                "submitted": 5.0, "script": "/s", "output": "/o", "grace_s": None}))
    assert read_slurm(path) == SlurmRecord("r1", "7", 5.0, "/s", "/o")  # a job id written as a number
    path.write_text(json.dumps({"format": 1, "run_id": "", "job_id": "7", "submitted": 5.0}))
    with pytest.raises(InputError) as caught:
        read_slurm(path)
    assert caught.value.one_line().startswith(f"{path}: run_id must be non-empty text")
