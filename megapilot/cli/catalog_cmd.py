"""`megapilot gpus` and `megapilot models`: the GPU catalog and the model presets.

`megapilot models --json` prints one object per model (a list without a MODEL argument): name,
aliases, source, hf_architecture, num_layers, hidden_size, ffn_hidden_size, num_attention_heads,
kv_heads (null under MLA), attention ("MHA" | "GQA" | "MLA" | "MLA+DSA", the last with DeepSeek Sparse
Attention), num_experts, router_topk (null when dense), vocab_size, params {total, main_model, active,
active_without_input_embedding, embedding, output_layer, layers, final_norm, mtp} (exact integers, unpadded
vocab; `total` includes MTP, `main_model` does not), total_params_b, active_params_b, and spec (the full
ModelSpec).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from megapilot.cli.common import console, emit_json

if TYPE_CHECKING:
    from rich.table import Table

    from megapilot.spec import ModelSpec

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


MeasureHostFlag = Annotated[bool, typer.Option("--measure-host",
                                                help="Measure this machine's CPU again (matmul and memory probes) "
                                                     "instead of reading its cached rates.")]


def gpus(json_output: JsonFlag = False, measure_host: MeasureHostFlag = False) -> None:
    """List the GPU catalog: dense peaks, HBM and interconnect; last, this machine's CPU (`cpu`), measured on it."""
    from rich.table import Table

    from megapilot.catalog import load_gpus
    from megapilot.catalog.host import host_cpu
    from megapilot.errors import MegapilotError

    specs = list(load_gpus().values())
    try:
        specs.append(host_cpu(remeasure=measure_host))
    except MegapilotError as exc:  # no numpy: the CPU is not a device here
        if measure_host:
            raise
        console.print(f"[dim]this machine's CPU is not listed: {exc}[/dim]")
    if json_output:
        emit_json([s.model_dump(mode="json") | {"precisions": sorted(s.precisions)} for s in specs])
        return
    table = Table(title="GPUs (dense peaks, per GPU)")
    for column in ("alias", "name", "arch", "BF16 TF/s", "FP8 TF/s", "FP4 TF/s", "HBM GiB", "HBM TB/s",
                   "scale-up", "scale-up GB/s"):
        table.add_column(column, justify="right" if "/" in column or "GiB" in column else "left")
    for s in specs:
        table.add_row(
            s.alias, s.name, s.architecture,
            f"{s.bf16_dense_tflops:,.0f}" if s.bf16_dense_tflops >= 10 else f"{s.bf16_dense_tflops:.4f}",
            f"{s.fp8_dense_tflops:,.0f}" if s.fp8_dense_tflops else "—",
            f"{s.fp4_dense_tflops:,.0f}" if s.fp4_dense_tflops else "—",
            f"{s.hbm_gib:.0f}", f"{s.hbm_bw_tbps:.2f}" if s.hbm_bw_tbps >= 0.1 else f"{s.hbm_bw_tbps:.4f}",
            f"{s.scaleup_domain_gpus} {'ranks' if s.architecture == 'cpu' else 'GPUs'}",  # a CPU's: its local ranks
            f"{s.scaleup_bw_gbps:.0f}" if s.scaleup_bw_gbps >= 10
            else f"{s.scaleup_bw_gbps:.2f}",
        )
    console.print(table)


ModelArgument = Annotated[
    str | None,
    typer.Argument(help="Show one model: a preset name, a Hugging Face hub id (org/name), a config.json (or its "
                       "folder), or a ModelSpec file."),
]


def _billions(count: int) -> float:
    return round(count / 1e9, 3)


def _attention_kind(spec: ModelSpec) -> str:
    if spec.mla is not None:
        if spec.csa is not None:
            return "MLA+CSA"  # DeepSeek-V4: window + compressed-KV attention
        return "MLA+DSA" if spec.dsa is not None else "MLA"
    return "GQA" if spec.is_gqa else "MHA"


def _model_row(spec: ModelSpec, source: str = "", aliases: tuple[str, ...] = ()) -> dict[str, Any]:
    """The stable JSON row of one model: shape, parameter counts (published convention: unpadded vocab)."""
    from megapilot.estimate.params import count_params

    counts = count_params(spec)
    moe = spec.moe
    return {
        "name": spec.name,
        "aliases": list(aliases),
        "source": source,
        "hf_architecture": spec.hf_architecture,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "ffn_hidden_size": spec.ffn_hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "kv_heads": None if spec.mla else spec.kv_heads,
        "attention": _attention_kind(spec),
        "num_experts": moe.num_experts if moe else None,
        "router_topk": moe.router_topk if moe else None,
        "vocab_size": spec.vocab_size,
        "params": {
            "total": counts.total,
            "main_model": counts.main_model,
            "active": counts.active,
            "active_without_input_embedding": counts.active_without_input_embedding,
            "embedding": counts.embedding,
            "output_layer": counts.output_layer,
            "layers": counts.layers,
            "final_norm": counts.final_norm,
            "mtp": counts.mtp,
        },
        "total_params_b": _billions(counts.total),
        "active_params_b": _billions(counts.active),
        "spec": spec.model_dump(mode="json"),
    }


def models(
    model: ModelArgument = None,
    json_output: JsonFlag = False,
) -> None:
    """List the model presets (layers, width, heads, experts, total and active parameters).

    With MODEL, show that one model (a preset, a HF config.json or its folder, a ModelSpec file).
    """
    from megapilot.catalog import get_model, get_preset, load_presets

    if model is None:
        rows = [_model_row(p.spec, p.source, p.aliases) for p in load_presets().values()]
    elif (preset := get_preset(model) if "/" not in model and "\\" not in model else None) is not None:
        rows = [_model_row(preset.spec, preset.source, preset.aliases)]  # the same row as in the list
    else:
        rows = [_model_row(get_model(model))]
    if json_output:
        emit_json(rows if model is None else rows[0])
        return
    console.print(_models_table(rows))
    if model is not None:
        console.print(_breakdown_table(rows[0]))


def _breakdown_table(row: dict[str, Any]) -> Table:
    """Where one model's parameters sit (exact counts)."""
    from rich.table import Table

    params = row["params"]
    table = Table(title=f"{row['name']}: parameters")
    table.add_column("part")
    table.add_column("parameters", justify="right")
    labels = {
        "embedding": "input embedding", "layers": "transformer layers", "final_norm": "final norm",
        "output_layer": "output layer (0 if tied)", "main_model": "= model", "mtp": "MTP modules",
        "total": "= total with MTP", "active": "active per token",
        "active_without_input_embedding": "active without input embedding",
    }
    for part, label in labels.items():
        table.add_row(label, f"{params[part]:,}")
    return table


def _models_table(rows: list[dict[str, Any]]) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(
        box=box.SIMPLE_HEAD,
        title="Models",
        caption="B = billions of parameters, unpadded vocab; total without MTP modules; active = what one token "
        "touches, input embedding included; experts = routed/top-k.",
    )
    table.add_column("name", no_wrap=True)
    for column in ("layers", "hidden", "heads/kv", "experts", "total B", "active B"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        kv = str(row["attention"]) if row["kv_heads"] is None else str(row["kv_heads"])
        experts = f"{row['num_experts']}/{row['router_topk']}" if row["num_experts"] else "—"
        table.add_row(
            row["name"], str(row["num_layers"]), str(row["hidden_size"]),
            f"{row['num_attention_heads']}/{kv}", experts,
            _format_billions(row["params"]["main_model"]), _format_billions(row["params"]["active"]),
        )
    return table


def _format_billions(count: int) -> str:
    billions = count / 1e9
    if billions >= 10:
        return f"{billions:,.1f}"
    return f"{billions:.3g}" if billions >= 0.01 else f"{billions:.2g}"


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus)
    app.command("models")(models)
