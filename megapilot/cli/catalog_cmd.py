"""`megapilot gpus`: list the GPU catalog. (`megapilot models` joins it with the model presets.)"""

from __future__ import annotations

from typing import Annotated

import typer

from megapilot.cli.common import console, emit_json

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def gpus(json_output: JsonFlag = False) -> None:
    """List the GPU catalog: dense peaks, HBM and interconnect."""
    from rich.table import Table

    from megapilot.catalog import load_gpus

    specs = list(load_gpus().values())
    if json_output:
        emit_json([s.model_dump(mode="json") | {"precisions": sorted(s.precisions)} for s in specs])
        return
    table = Table(title="GPUs (dense peaks, per GPU)")
    for column in ("alias", "name", "arch", "BF16 TF/s", "FP8 TF/s", "FP4 TF/s", "HBM GiB", "HBM TB/s",
                   "scale-up", "scale-up GB/s"):
        table.add_column(column, justify="right" if "/" in column or "GiB" in column else "left")
    for s in specs:
        table.add_row(
            s.alias, s.name, s.architecture, f"{s.bf16_dense_tflops:,.0f}",
            f"{s.fp8_dense_tflops:,.0f}" if s.fp8_dense_tflops else "—",
            f"{s.fp4_dense_tflops:,.0f}" if s.fp4_dense_tflops else "—",
            f"{s.hbm_gib:.0f}", f"{s.hbm_bw_tbps:.2f}", f"{s.scaleup_domain_gpus} GPUs", f"{s.scaleup_bw_gbps:.0f}",
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus)
