"""``fstrain bench``: measure the fabric and every GPU, name the slow link or the straggler.

Exit status: 0 measured and nothing stands out, 1 an outlier link or host or a straggler rank,
2 bad input (one ``error:`` line, before any host is contacted), 3 nothing to judge: a host
could not run the benchmark (down, no torch), the job failed, or its result was lost; 130 on
Ctrl-C. ``--from FILE`` prints a saved result's report and verdict again, contacting no host.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from fstrain.cli import hostopts
from fstrain.cli.output import console, print_json, say


def register(app: typer.Typer) -> None:
    app.command("bench", help="Measure collectives, node-to-node links and GPUs on every selected host; "
                "name outliers. Exit 0 ok, 1 outliers, 2 bad input, 3 not measured.")(bench_command)


def bench_command(
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    gpus_per_node: int | None = hostopts.GPUS_PER_NODE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    suite: str = typer.Option("all", "--suite", metavar="SUITES",
                              help="collectives, pairs, compute, all, or a comma list."),
    sizes: str | None = typer.Option(None, "--sizes", metavar="SIZES",
                                     help="Message sizes: 1M-1G (x2 steps), 1M-1G:4, 1M,64M "
                                     "(default 1M-1G with nccl, 64K-16M with gloo)."),
    backend: str | None = typer.Option(None, "--backend", metavar="nccl|gloo",
                                       help="nccl or gloo (default: nccl where there are GPUs)."),
    python: str = typer.Option("python3", "--python", help="Interpreter on the hosts (with torch)."),
    nproc_per_node: int | None = typer.Option(None, "--nproc-per-node", min=1, metavar="N",
                                              help="Ranks per node (default: slots, else GPUs, else 1)."),
    pairs_mode: str = typer.Option("auto", "--pairs", metavar="all|ring|auto",
                                   help="all (every ordered pair), ring (a ring and its reverse) "
                                   "or auto (all up to 16 nodes)."),
    pair_bytes: str | None = typer.Option(None, "--pair-bytes", metavar="BYTES",
                                          help="Bytes per pair transfer (default 256M nccl, 16M gloo)."),
    seconds: float = typer.Option(0.5, "--seconds", min=0.01, metavar="SECONDS",
                                  help="Time budget per collective and size."),
    model: str | None = typer.Option(None, "--model", "-m", help="Compute suite: time the GEMMs this shipped recipe "
                                     "(or Hugging Face id) runs, not the default grid."),
    recipe: str | None = typer.Option(None, "--recipe", help="Compute suite: the GEMMs of your recipe file's model."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="With --model: tokens per sequence "
                                       "(default: the recipe's)."),
    micro_batch: int | None = typer.Option(None, "--micro-batch", min=1, help="With --model: sequences per "
                                           "micro-batch (default: the recipe's, else 1)."),
    tp: int = typer.Option(1, "--tp", min=1, help="With --model: the tensor-parallel degree the GEMMs are split by."),
    gemm_dtype: str = typer.Option("auto", "--gemm-dtype", metavar="auto|bf16|fp16|fp32",
                                   help="dtype of the GEMM sweep (auto: bf16 on GPUs; on a CPU the faster of "
                                   "bf16 and fp32)."),
    max_gemm_flops: str | None = typer.Option(None, "--max-gemm-flops", metavar="FLOPS",
                                              help="Do not time GEMMs above this many FLOPs (default: none on "
                                              "GPUs, 2e10 on CPUs)."),
    workdir: str | None = typer.Option(None, "--workdir", help="Working directory on every host."),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE for every rank (repeatable)."),
    master_port: int | None = typer.Option(None, "--master-port", min=1, max=65535, help="Rendezvous port."),
    run_dir: str | None = typer.Option(None, "--run-dir", help="Logs, manifest and results (default runs/<run id>)."),
    out: str | None = typer.Option(None, "--out", metavar="FILE",
                                   help="Also write the result document (JSON) to FILE."),
    json_output: bool = typer.Option(False, "--json", help="Print the result document on stdout."),
    from_file: str | None = typer.Option(None, "--from", metavar="FILE",
                                         help="Print the report of a saved result (bench.json) again; "
                                         "no host is contacted."),
) -> None:
    """Run the benchmark suites on every selected host and report what stands out."""
    from fstrain.api.bench import BenchOptions, BenchRunRequest, bench
    from fstrain.api.job import collect_env
    from fstrain.api.requests import HostRequest
    from fstrain.cli.progress_output import progress_reporter

    if from_file is not None:
        raise typer.Exit(reprint(from_file, json_output))
    request = BenchRunRequest(
        HostRequest(hostfile=hostfile, hosts=hosts, include=include, exclude=exclude, gpus_per_node=gpus_per_node,
                    ssh_config=ssh_config, accept_new_hosts=accept_new_hosts, fanout=fanout),
        BenchOptions(suite=suite, sizes=sizes, backend=backend, python=python, nproc_per_node=nproc_per_node,
                     pairs_mode=pairs_mode, pair_bytes=pair_bytes, seconds=seconds, workdir=workdir,
                     env=collect_env(env, None), master_port=master_port, run_dir=run_dir, model=model,
                     recipe=recipe, seq_len=seq_len, micro_batch=micro_batch, tp=tp, gemm_dtype=gemm_dtype,
                     max_gemm_flops=max_gemm_flops),
        out=out)
    try:
        with progress_reporter() as reporter:
            benched = bench(request, report=say, out=reporter.routed(sys.stderr), progress=reporter)
    except KeyboardInterrupt:
        console().print("[red]interrupted[/red]")
        raise typer.Exit(130) from None
    if benched.document is not None:
        lines = print_report(benched.document)
        (benched.run_dir / "report.txt").write_text("\n".join(lines) + "\n")
        if json_output:
            print_json(benched.document)
    else:
        if benched.outcome is not None:
            from fstrain.cli.launch_output import print_summary

            print_summary(benched.outcome)
        else:
            console().print(f"[red]error:[/red] {benched.failure}", highlight=False, soft_wrap=True)
        if json_output:  # nothing measured: still one document, saying why (the manifest has the rest)
            print_json({"run_id": benched.run_id, "run_dir": str(benched.run_dir), "exit_code": benched.exit_code,
                        "failure": benched.failure, "manifest": str(benched.run_dir / "manifest.json")})
    raise typer.Exit(benched.exit_code)


def reprint(path: str, json_output: bool) -> int:
    """``--from FILE``: the report and the verdict's exit code of a saved document."""
    from fstrain.api.bench import EXIT_OUTLIERS, has_outliers, read_bench

    document = read_bench(path)
    console().print(f"bench {document.get('run_id', '')} from {path}: {', '.join(document.get('suites', []))} on "
                    f"{len(document.get('nodes', []))} hosts", highlight=False)
    print_report(document)
    if json_output:
        print_json(document)
    return EXIT_OUTLIERS if has_outliers(document["analysis"]) else 0


def print_report(document: dict[str, Any]) -> list[str]:
    """Tables and bar charts on stderr; returns the plain-text charts and verdicts (for report.txt)."""
    from fstrain.cli.bench_output import print_collectives, print_compute, print_pairs

    lines: list[str] = []
    if "collectives" in document:
        lines += print_collectives(document)
    if "pairs" in document:
        lines += print_pairs(document)
    if "compute" in document:
        lines += print_compute(document)
    return lines

