"""The per-layer table `estimate --layers` and `plan --layers` print (megapilot.estimate.layer_report)."""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

from megapilot.cli.common import console

if TYPE_CHECKING:
    from megapilot.estimate.layer_report import LayerGroup

LAYERS_HELP = ("Also show where one micro-batch's time goes in each kind of layer, term by term (ms), and what binds "
               "its attention core.")


def print_layers(groups: tuple[LayerGroup, ...]) -> None:
    """One column per kind of layer: its terms for one micro-batch, forward + backward (ms)."""
    from rich.table import Table

    table = Table(title="one micro-batch per layer, forward + backward (ms)", show_header=True, header_style="bold")
    table.add_column("term")
    for group in groups:
        table.add_column(f"layers {layer_ranges(group.layers)}", justify="right")
    terms = list(dict.fromkeys(term for group in groups for term in group.terms_s))
    for term in terms:
        table.add_row(term, *(f"{group.terms_s[term] * 1e3:.3f}" if term in group.terms_s else "-"
                              for group in groups))
    table.add_row("total", *(f"{group.total_s * 1e3:.3f}" for group in groups))
    table.add_row("attention core: fwd / bwd x MMA time", *(
        f"{bound.forward:.2f} / {bound.backward:.2f} ({bound.backward_by})" if (bound := group.attention) else "-"
        for group in groups))
    console.print(table)


def layer_ranges(indices: tuple[int, ...]) -> str:
    """Layer indices as a short label: 0-2, 5; 1-23 every 2nd; or the first few of many scattered ones."""
    gaps = {b - a for a, b in pairwise(indices)}
    if len(indices) > 2 and len(gaps) == 1 and (step := gaps.pop()) > 1:
        return f"{indices[0]}-{indices[-1]} every {step}{'nd' if step == 2 else 'rd' if step == 3 else 'th'}"
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    labels = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
    return ", ".join(labels) if len(labels) <= 4 else f"{', '.join(labels[:3])}, ... ({len(indices)} layers)"
