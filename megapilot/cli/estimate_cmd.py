"""`megapilot estimate`: memory, step time, throughput and MFU of one layout (or a batch of them).

`--json` prints the `EstimateResult` schema: params {total, active, embedding}, flops_per_step,
memory_gib {weights, gradients, optimizer, activations, overhead, total, capacity, stage}, fits,
step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu, time_breakdown_s {compute, recompute,
tp_comm, cp_comm, ep_comm, pp_comm, pp_bubble, dp_comm, optimizer}, warnings, bubble_fraction,
exposed_comm_fraction, flop_convention (`--flop-convention megatron_full_attention` counts the
attention core over the full s x s matrix, as Megatron-Core <= 0.11 and older NeMo did).

`--batch cases.jsonl`: one JSON object per line whose keys are the long flag names with `_`
(`{"model": "llama3.1-70b", "gpu": "h100", "gpus": 64, "tp": 4, "gbs": 1024, "seq_len": 4096}`);
prints a list of results in line order, `{"error", "field", "fix", "line"}` for a bad line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from megapilot.cli.common import console, emit_json
from megapilot.errors import MegapilotError


def register(app: typer.Typer) -> None:
    """Add `estimate` to the app."""
    app.command("estimate")(estimate)


def estimate(
    model: Annotated[str | None, typer.Option(help="Model preset (e.g. llama3.1-70b) or a HF config.json path.")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU alias or catalog name, e.g. h100.")] = None,
    gpus: Annotated[int | None, typer.Option(help="Total GPUs.")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node (default 8; 4 on GB200/GB300).")] = None,
    tp: Annotated[int | None, typer.Option(help="Tensor parallel size (default 1).")] = None,
    pp: Annotated[int | None, typer.Option(help="Pipeline parallel size (default 1).")] = None,
    vpp: Annotated[int | None, typer.Option(help="Virtual pipeline stages per rank (default 1).")] = None,
    cp: Annotated[int | None, typer.Option(help="Context parallel size (default 1).")] = None,
    ep: Annotated[int | None, typer.Option(help="Expert parallel size (default 1).")] = None,
    etp: Annotated[int | None, typer.Option(help="Expert tensor parallel size (default: tp).")] = None,
    mbs: Annotated[int | None, typer.Option(help="Micro-batch size (default 1).")] = None,
    gbs: Annotated[int | None, typer.Option(help="Global batch size, sequences.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length, tokens.")] = None,
    precision: Annotated[str | None, typer.Option(help="bf16 | fp16 | fp8 | mxfp8 | nvfp4 (default bf16).")] = None,
    recompute: Annotated[str | None, typer.Option(help="none | selective | full (default selective).")] = None,
    recompute_num_layers: Annotated[int | None, typer.Option(help="With full recompute: layers per group.")] = None,
    sequence_parallel: Annotated[
        bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Default: on when tp > 1.")
    ] = None,
    distributed_optimizer: Annotated[
        bool, typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Shard optimizer state over DP.")
    ] = True,
    fsdp: Annotated[bool, typer.Option("--fsdp", help="Megatron-FSDP: shard weights, grads and optimizer.")] = False,
    first_stage_layers: Annotated[
        int | None, typer.Option(help="Layers on the first pipeline rank (uneven split; default: even).")
    ] = None,
    last_stage_layers: Annotated[
        int | None, typer.Option(help="Layers on the last pipeline rank (uneven split; default: even).")
    ] = None,
    force_tp_across_nodes: Annotated[
        bool, typer.Option("--force-tp-across-nodes", help="Cost a TP group larger than a node instead of refusing.")
    ] = False,
    flop_convention: Annotated[
        str, typer.Option(help="megatron (causal, current) | megatron_full_attention (core <= 0.11, NeMo < 2025-08).")
    ] = "megatron",
    batch: Annotated[Path | None, typer.Option(help="JSONL file: one case per line (keys = flag names).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Estimate memory, step time, tokens/s and MFU of one parallel layout."""
    if batch is not None:
        results = run_batch(batch, flop_convention)
        emit_json(results) if json_output else _print_batch(results)
        return
    flags = {
        "model": model, "gpu": gpu, "gpus": gpus, "gpus_per_node": gpus_per_node, "tp": tp, "pp": pp, "vpp": vpp,
        "cp": cp, "ep": ep, "etp": etp, "mbs": mbs, "gbs": gbs, "seq_len": seq_len, "precision": precision,
        "recompute": recompute, "recompute_num_layers": recompute_num_layers,
        "sequence_parallel": sequence_parallel, "distributed_optimizer": distributed_optimizer, "fsdp": fsdp,
        "first_stage_layers": first_stage_layers, "last_stage_layers": last_stage_layers,
        "force_tp_across_nodes": force_tp_across_nodes,
    }
    result = estimate_flags(flags, flop_convention)
    emit_json(result) if json_output else _print_result(result, flags)


def estimate_flags(flags: dict[str, Any], flop_convention: str = "megatron") -> dict[str, Any]:
    """Flags -> the JSON-ready estimate (MegapilotError on any bad flag or impossible layout)."""
    from megapilot.estimate import FLOP_CONVENTIONS, build_case
    from megapilot.estimate import estimate as run_estimate

    if flop_convention not in FLOP_CONVENTIONS:
        raise MegapilotError(f"unknown convention {flop_convention!r}", field="flop_convention",
                             fix=f"use one of: {', '.join(FLOP_CONVENTIONS)}")
    case = build_case(**flags)
    result = run_estimate(case.model, case.cluster, case.training, case.parallel, convention=flop_convention,
                          allow_tp_across_nodes=case.allow_tp_across_nodes)
    return result.model_dump(mode="json")


def run_batch(path: Path, flop_convention: str = "megatron") -> list[dict[str, Any]]:
    """Estimate every line of a JSONL file; a bad line yields its error object, not a failed batch."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise MegapilotError(f"cannot read {path} ({exc.strerror})", field="batch", fix="pass a readable JSONL file")
    except UnicodeDecodeError:
        raise MegapilotError(f"{path} is not UTF-8 text", field="batch", fix="pass a JSONL text file")
    if not any(line.strip() for line in lines):
        raise MegapilotError(f"{path} holds no case", field="batch", fix='write one {"model": ...} object per line')
    results = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            results.append(_one_line(line, number, flop_convention))
    return results


def _one_line(line: str, number: int, flop_convention: str) -> dict[str, Any]:
    try:
        flags = json.loads(line)
        if not isinstance(flags, dict):
            raise MegapilotError("must be a JSON object of flags", field="batch", fix='write {"model": ...} per line')
        return estimate_flags(flags, flop_convention)
    except json.JSONDecodeError as exc:
        return {"error": f"not valid JSON ({exc.msg})", "field": "batch", "fix": "one JSON object per line",
                "line": number}
    except MegapilotError as exc:
        return exc.to_dict() | {"line": number}


# ---- human output --------------------------------------------------------------------------------


def _print_result(result: dict[str, Any], flags: dict[str, Any]) -> None:
    from rich.table import Table

    from megapilot.estimate.units import format_count, format_duration

    memory, breakdown = result["memory_gib"], result["time_breakdown_s"]
    verdict = "[green]fits[/]" if result["fits"] else "[bold red]does NOT fit[/]"
    console.print(
        f"[bold]{flags['model']}[/] on {flags['gpus']} x {flags['gpu']}: {verdict} "
        f"{memory['total']:.1f} / {memory['capacity']:.0f} GiB · {format_duration(result['step_time_s'])}/step · "
        f"{result['tokens_per_s_per_gpu']:,.0f} tok/s/GPU · {result['tflops_per_gpu']:.0f} TFLOP/s/GPU · "
        f"MFU {result['mfu']:.1%}"
    )
    table = Table(show_header=True, header_style="bold")
    table.add_column("memory (GiB, most-loaded GPU)")
    table.add_column("", justify="right")
    table.add_column("step time")
    table.add_column("", justify="right")
    mem_rows = [(k, f"{memory[k]:.2f}") for k in ("weights", "gradients", "optimizer", "activations", "overhead")]
    mem_rows += [("total", f"{memory['total']:.2f}"), ("capacity", f"{memory['capacity']:.0f}")]
    time_rows = [(k, format_duration(v)) for k, v in breakdown.items() if v > 0]
    time_rows.append(("step", format_duration(result["step_time_s"])))
    for i in range(max(len(mem_rows), len(time_rows))):
        left = mem_rows[i] if i < len(mem_rows) else ("", "")
        right = time_rows[i] if i < len(time_rows) else ("", "")
        table.add_row(*left, *right)
    console.print(table)
    params = result["params"]
    console.print(
        f"params {format_count(params['total'])} (active {format_count(params['active'])}) · "
        f"model FLOPs/step {result['flops_per_step']:.3e} ({result['flop_convention']} convention) · "
        f"bubble {result['bubble_fraction']:.1%} · exposed comm {result['exposed_comm_fraction']:.1%}"
    )
    for warning in result["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")


def _print_batch(results: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from megapilot.estimate.units import format_duration

    table = Table(title="estimates")
    for column in ("#", "fits", "GiB", "step", "tok/s/GPU", "TFLOP/s", "MFU", "error"):
        table.add_column(column, justify="left" if column == "error" else "right")
    for number, r in enumerate(results, start=1):
        if "error" in r:
            table.add_row(str(number), "", "", "", "", "", "", r["error"])
            continue
        table.add_row(
            str(number), "yes" if r["fits"] else "[red]no[/]", f"{r['memory_gib']['total']:.1f}",
            format_duration(r["step_time_s"]), f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['tflops_per_gpu']:.0f}",
            f"{r['mfu']:.1%}", "",
        )
    console.print(table)
