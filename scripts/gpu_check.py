#!/usr/bin/env python3
"""The GPU-machine check for the topology work (issue 3). Needs a GPU; installs nothing.

Run from the repository root on a GPU machine:  python3 scripts/gpu_check.py [OUT_DIR]
(OUT_DIR defaults to $OUT, else ./gpu-check-out). It must finish well under 8 minutes: the probe
takes seconds, each NCCL job is capped at 150 s. To rehearse on a machine without a GPU:
python3 scripts/gpu_check.py OUT_DIR --report tests/fixtures/probe/simai-2a100-nvswitch-2bond.json

1. Records what the machine has (python, torch, nvidia-smi) and a real probe report (fixture).
2. Generates our NCCL topology XML from that report and reads it back with our parser.
3. Runs a one-GPU NCCL job (torch.distributed, backend nccl, world size 1, one all_reduce) twice:
   once with NCCL's own detection, NCCL_TOPO_DUMP_FILE set, to see what NCCL builds by itself;
   once with NCCL_TOPO_FILE set to our XML (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH), log kept.
4. Checks: the log says NCCL loaded our file by path and by its <system name>, the all_reduce
   result is right, NCCL's merged dump has our GPU once under one <cpu> (the bus ids and NUMA id
   matched, so NCCL did not add a second, detected node); it also lists every attribute where our
   file and NCCL's own detection differ (informational: see docs/topology.md, known limits).
5. `fstrain bench`'s worker: the compute suite (bf16 matmul TFLOPS, HBM copy bandwidth per GPU) and the
   collectives over all the machine's GPUs with NCCL (bench-compute.json, bench-collectives.json).

On a lent GPU machine, run it through scripts/gpu_session.sh (it packs the files below into the few
the device tool brings back); then copy probe-report.json to tests/fixtures/probe/ with its provenance.

Files written to OUT: probe-report.json, topo.xml, nccl-detected.log, nccl-detected-dump.xml,
nccl-with-topo.log, nccl-with-topo-dump.xml, bench-compute.{json,log}, bench-collectives.{json,log},
summary.json. Exit status 0 when every check passed, 1 when one failed, 2 when there is no GPU or
no torch to run NCCL with (recorded in summary.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

NCCL_JOB = r"""
import sys, torch, torch.distributed as dist
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), flush=True)
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
t = torch.arange(1024, dtype=torch.float32, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
ok = bool(torch.equal(t.cpu(), torch.arange(1024, dtype=torch.float32)))
dist.destroy_process_group()
print("ALLREDUCE_OK" if ok else "ALLREDUCE_WRONG", flush=True)
"""
JOB_TIMEOUT_S = 150


def run(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, object]:
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
        out = {"exit_code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    except FileNotFoundError:
        out = {"exit_code": None, "stdout": "", "stderr": f"{argv[0]}: not found"}
    except subprocess.TimeoutExpired as exc:
        out = {"exit_code": None, "stdout": str(exc.stdout or ""), "stderr": f"timed out after {timeout_s} s"}
    out["seconds"] = round(time.monotonic() - start, 1)
    return out


def nccl_job(out: Path, tag: str, extra_env: dict[str, str]) -> dict[str, object]:
    """One world-size-1 NCCL all_reduce; its whole output is kept as OUT/nccl-<tag>.log."""
    env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH",
           "NCCL_TOPO_DUMP_FILE": str(out / f"nccl-{tag}-dump.xml"), **extra_env}
    if "NCCL_TOPO_FILE" not in extra_env:
        env.pop("NCCL_TOPO_FILE", None)  # the detection run must not load a file from the environment
    store = Path("/tmp") / f"fstrain-gpu-check-{tag}-{os.getpid()}"
    store.unlink(missing_ok=True)
    result = run([sys.executable, "-c", NCCL_JOB, str(store)], JOB_TIMEOUT_S, env)
    log = f"$ {' '.join(f'{k}={v}' for k, v in extra_env.items())} python -c NCCL_JOB\n"
    log += f"exit {result['exit_code']} after {result['seconds']} s\n{result['stdout']}{result['stderr']}"
    (out / f"nccl-{tag}.log").write_text(log)
    return {"exit_code": result["exit_code"], "seconds": result["seconds"],
            "allreduce_ok": "ALLREDUCE_OK" in str(result["stdout"]), "log": log}


def compare_with_detection(ours_text: str, dump_text: str) -> list[str]:
    """Attributes both files give the same element (by busid / numaid / net name) that differ."""
    from fstrain.core.topo.ncclxml import XmlElement, parse_nccl_xml

    def index(root: XmlElement) -> dict[str, XmlElement]:
        found: dict[str, XmlElement] = {}
        for element in root.iter("cpu"):
            found[f"cpu {element.attrs.get('numaid')}"] = element
        for element in root.iter("pci"):
            found[f"pci {element.attrs.get('busid')}"] = element
            for gpu in element.subs("gpu"):
                found[f"gpu {element.attrs.get('busid')}"] = gpu
        for element in root.iter("net"):
            found[f"net {element.attrs.get('name')}"] = element
        return found

    ours, _ = parse_nccl_xml(ours_text, "ours")
    theirs, _ = parse_nccl_xml(dump_text, "nccl dump")
    mine, detected = index(ours), index(theirs)
    differences = [f"{key}: NCCL has no such element" for key in mine if key not in detected]
    for key, element in mine.items():
        other = detected.get(key)
        if other is None:
            continue
        for attr, value in element.attrs.items():
            # rank/host_hash are per process; sysfs link speed vs NVML current gen is a known NCCL 2.30 change
            if attr in other.attrs and other.attrs[attr] != value and attr not in ("rank", "host_hash"):
                differences.append(f"{key} {attr}: ours {value!r}, NCCL detected {other.attrs[attr]!r}")
    return differences


BENCH_TIMEOUT_S = 120


def bench_suites(out: Path, checks: dict[str, object], num_gpus: int) -> None:
    """`fstrain bench`'s worker on this machine: the compute suite on every GPU (bf16 matmul TFLOPS,
    HBM copy bandwidth) and the collectives over all its GPUs with NCCL (busbw is 0 on one GPU by
    nccl-tests' definition; algbw is still measured). Files: bench-compute.json, bench-collectives.json."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    runs = {
        "compute": [sys.executable, "-m", "fstrain.bench", "--suite", "compute", "--compute-seconds", "3",
                    "--json-out", str(out / "bench-compute.json")],
        "collectives": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                        str(num_gpus), "-m", "fstrain.bench", "--suite", "collectives", "--backend", "nccl",
                        "--sizes", "1M-1G:4", "--seconds", "0.3", "--json-out", str(out / "bench-collectives.json")],
    }  # fmt: skip
    for suite, argv in runs.items():
        result = run(argv, BENCH_TIMEOUT_S, env)
        (out / f"bench-{suite}.log").write_text(f"$ {' '.join(argv)}\nexit {result['exit_code']} after "
                                                f"{result['seconds']} s\n{result['stdout']}{result['stderr']}")
        path = out / f"bench-{suite}.json"
        checks[f"bench_{suite}_ok"] = result["exit_code"] == 0 and path.exists()
        if path.exists():
            checks[f"bench_{suite}"] = bench_headline(suite, json.loads(path.read_text()))


def bench_headline(suite: str, document: dict[str, object]) -> object:
    """The numbers worth reading in the summary (the whole document is in the JSON file)."""
    if suite == "compute":
        ranks = document.get("compute", {}).get("per_rank", [])  # type: ignore[union-attr]
        return [{key: rank.get(key, {}).get(metric, {}).get("median")  # type: ignore[union-attr]
                 for key, metric in (("matmul", "tflops"), ("memory", "gbps"))} for rank in ranks]
    scopes = document.get("collectives", {}).get("scopes", [])  # type: ignore[union-attr]
    return [{k: r.get(k) for k in ("collective", "size_bytes", "algbw_gbps", "busbw_gbps")}
            for scope in scopes for r in scope.get("results", []) if not r.get("latency_size")][-5:]


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "gpu-check-out")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {"checks": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    checks: dict[str, object] = summary["checks"]  # type: ignore[assignment]

    def finish(code: int) -> int:
        summary["exit_code"] = code
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
        print(json.dumps(checks, indent=2, sort_keys=True, default=str))
        print(f"gpu_check: {'OK' if code == 0 else 'FAILED' if code == 1 else 'NOT RUN'} (files in {out})")
        return code

    try:
        return steps(out, summary, checks, finish)
    except Exception:  # a blind run on a lent machine must still leave its summary behind
        checks["crashed"] = traceback.format_exc()
        return finish(1)


def steps(out: Path, summary: dict[str, object], checks: dict[str, object], finish: Callable[[int], int]) -> int:
    summary["python"] = sys.version.split()[0]
    summary["nvidia_smi"] = run(["nvidia-smi", "-L"], 30)
    torch_probe = run([sys.executable, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"], 120)
    summary["torch"] = (str(torch_probe["stdout"]).strip() or str(torch_probe["stderr"]).strip()[-300:])

    from fstrain.core.parsers.probe_report import node_from_report
    from fstrain.core.topo.ncclxml import read_nccl_topology
    from fstrain.core.topofile.ncclxml_gen import xml_from_report
    from fstrain.io.probe import probe_local

    # --report FILE rehearses the steps after the probe with a saved report (on a machine without GPU).
    if len(sys.argv) > 3 and sys.argv[2] == "--report":
        from fstrain.core.parsers.probe_report import validate_report

        report = validate_report(json.loads(Path(sys.argv[3]).read_text()), sys.argv[3])
    else:
        report = probe_local()
    (out / "probe-report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    checks["probe_gpu_source"] = report["gpu_source"]
    checks["probe_gpus"] = len(report["gpus"])
    checks["probe_missing"] = [f"{m.get('what')}: {m.get('why')}" for m in report["missing"]]
    if not report["gpus"]:
        checks["skipped"] = f"no GPU: {report.get('gpu_source_reason')}"
        return finish(2)
    node = node_from_report(report)
    checks["node_source"] = node.source
    generated = xml_from_report(report)
    topo_path = out / "topo.xml"
    topo_path.write_text(generated.text)
    checks["xml_missing"] = list(generated.missing)
    reread, warnings = read_nccl_topology(generated.text, str(topo_path))
    checks["xml_reads_back"] = [g.pci_bus_id for g in reread.gpus] == [g.pci_bus_id for g in node.gpus]
    checks["xml_reader_warnings"] = list(warnings)
    if torch_probe["exit_code"] != 0:
        checks["skipped"] = "torch is not importable here: the NCCL job cannot run"
        return finish(2)

    detected = nccl_job(out, "detected", {})
    checks["detected_job_allreduce_ok"] = detected["allreduce_ok"]
    with_topo = nccl_job(out, "with-topo", {"NCCL_TOPO_FILE": str(topo_path)})
    log = str(with_topo["log"])
    checks["with_topo_allreduce_ok"] = with_topo["allreduce_ok"]
    checks["log_loading_topology_file"] = f"Loading topology file {topo_path}" in log
    checks["log_loading_topology_name"] = f"Loading topology {generated.name}" in log
    checks["log_no_open_failure"] = "Could not open XML topology file" not in log
    dump_path = out / "nccl-with-topo-dump.xml"
    if dump_path.exists():
        dump_node, _ = read_nccl_topology(dump_path.read_text(), str(dump_path))
        bus = node.gpus[0].pci_bus_id
        checks["dump_gpu_bus_ids"] = [g.pci_bus_id for g in dump_node.gpus]
        checks["dump_gpu_matched_once"] = dump_path.read_text().count(f'busid="{bus}"') == 1
        checks["dump_numa"] = [g.numa_node for g in dump_node.gpus]
        checks["dump_numa_matches"] = [g.numa_node for g in dump_node.gpus][:1] == [node.gpus[0].numa_node]
    else:
        checks["dump_gpu_matched_once"] = False
    detected_dump = out / "nccl-detected-dump.xml"
    if detected_dump.exists():
        # Informational: where our generator and NCCL's own detection disagree (e.g. NCCL 2.30 takes
        # the GPU link speed from NVML's current PCIe generation, which idles low).
        checks["differences_from_nccl_detection"] = compare_with_detection(generated.text, detected_dump.read_text())
    bench_suites(out, checks, len(report["gpus"]))
    required = ["xml_reads_back", "detected_job_allreduce_ok", "with_topo_allreduce_ok", "log_loading_topology_file",
                "log_loading_topology_name", "log_no_open_failure", "dump_gpu_matched_once", "bench_compute_ok",
                "bench_collectives_ok"]
    checks["failed"] = [name for name in required if checks.get(name) is not True]
    return finish(1 if checks["failed"] else 0)


if __name__ == "__main__":
    sys.exit(main())
