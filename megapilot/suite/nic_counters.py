"""NIC error counters before and after a run, per node: a counter that grew while the suite trained names the node
whose link went bad (CVS reads its RDMA and ethtool counters the same way).

The snapshot is a small bash script run on every node through the executor: at preflight (`before`) and after the
last combo (`after`), each node's readings kept in `<run_dir>/nic_counters/<phase>-nodeK.txt` (a resumed run compares
with the snapshot its preflight took). It reads, where present:
- InfiniBand/RoCE port counters: `/sys/class/infiniband/<dev>/ports/<port>/{counters,hw_counters}/*`
  (`symbol_error`, `link_downed`, `port_rcv_errors`, `port_xmit_discards`, ...);
- every interface's kernel statistics: `/sys/class/net/<if>/statistics/*` (`rx_errors`, `rx_dropped`, ...);
- `ethtool -S <if>` where ethtool is installed (the driver's own counters: `rx_crc_errors_phy`, ...).
Which counters count faults is `megapilot.logs.health.grown_fault_counters`; the verdict is
`megapilot.diagnose.nodes.check_nic`. A node's row FAILs on a GPU run; a CPU run's row is recorded, not gated: its
"nodes" share this host's interfaces with every other process, whose dropped packets say nothing of a training link.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.diagnose.nodes import check_nic
from megapilot.errors import MegapilotError
from megapilot.logs.health import grown_fault_counters
from megapilot.suite.results import MetricRow, Verdict

if TYPE_CHECKING:
    from megapilot.execute.base import Executor
    from megapilot.suite.config import LoadedSuite

FOLDER = "nic_counters"
ROW = "nic.counters"

# `$1`: the sysfs root (`/sys`; a test points it at a fake tree). Never fails: what is absent is not printed.
COUNTERS_SCRIPT = r"""
root=${1:-/sys}
printf 'host=%s\n' "${SLURMD_NODENAME:-$(hostname 2>/dev/null || echo unknown)}"  # SLURM's name, as in preflight
for f in "$root"/class/infiniband/*/ports/*/counters/* "$root"/class/infiniband/*/ports/*/hw_counters/*; do
  [ -f "$f" ] || continue
  rel=${f#"$root"/class/infiniband/}
  printf 'counter=ib:%s=%s\n' "$rel" "$(cat "$f" 2>/dev/null | tr -d ' ')"
done
for f in "$root"/class/net/*/statistics/*; do
  [ -f "$f" ] || continue
  rel=${f#"$root"/class/net/}
  case $rel in lo/*) continue ;; esac
  printf 'counter=net:%s=%s\n' "$rel" "$(cat "$f" 2>/dev/null | tr -d ' ')"
done
if [ "$root" = /sys ] && command -v ethtool >/dev/null 2>&1; then
  for nic in /sys/class/net/*; do
    name=${nic##*/}
    [ "$name" = lo ] && continue
    pattern="s/^ *\([A-Za-z0-9_.:-]*\): *\([0-9][0-9]*\) *$/counter=ethtool:$name\/\1=\2/p"
    ethtool -S "$name" 2>/dev/null | sed -n "$pattern"
  done
fi
exit 0
"""


def parse_counter_lines(text: str) -> dict[str, int]:
    """`counter=<source>:<path>=<value>` lines → {"ib:mlx5_0/ports/1/counters/symbol_error": 3, ...}."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith("counter="):
            continue
        name, _, value = line[len("counter="):].rpartition("=")
        if name and value.strip().isdigit():
            counters[name] = int(value)
    return counters


def counter_label(name: str) -> str:
    """A counter's short name: `mlx5_0 port 1 symbol_error`, `eth0 rx_errors`, `eth0 rx_crc_errors_phy`."""
    source, _, path = name.partition(":")
    parts = path.split("/")
    if source == "ib" and len(parts) >= 5:
        return f"{parts[0]} port {parts[2]} {parts[-1]}"
    return f"{parts[0]} {parts[-1]}" if len(parts) > 1 else path


def take_snapshot(suite: LoadedSuite, executor: Executor, run_dir: Path, phase: str) -> list[str]:
    """Every node's counters now, kept as `<run_dir>/nic_counters/<phase>-nodeK.txt` (an unreachable node's file
    holds its error); each node's name as the node lists write it (the executor's, else its hostname)."""
    folder = run_dir / FOLDER
    folder.mkdir(exist_ok=True)
    names: list[str] = []
    try:
        outputs = executor.run_on_nodes(COUNTERS_SCRIPT, ["/sys"], suite.nodes)
    except (MegapilotError, OSError) as exc:  # the nodes cannot be reached now: the rows say the snapshot is missing
        (folder / f"{phase}-error.txt").write_text(f"{exc}\n", encoding="utf-8")
        return names
    for output in outputs:
        error = f"\nerror={output.error}\n" if output.error else ""
        (folder / f"{phase}-node{output.node}.txt").write_text(output.text + error, encoding="utf-8")
        host = next((line[5:] for line in output.text.splitlines() if line.startswith("host=")), "")
        names.append(output.name or host or f"node{output.node}")
    return names


def counter_rows(run_dir: Path, nodes: int, *, cpu: bool) -> list[MetricRow]:
    """One row per node: the fault counters that grew between the `before` and `after` snapshots."""
    rows = []
    for node in range(nodes):
        name = f"node{node}.{ROW}" if nodes > 1 else ROW
        snapshots = [run_dir / FOLDER / f"{phase}-node{node}.txt" for phase in ("before", "after")]
        if not all(path.is_file() for path in snapshots):
            rows.append(MetricRow(name=name, node=node, verdict=Verdict.SKIPPED, enforced=False,
                                  reason="no counter snapshot from " + " and ".join(
                                      p.name for p in snapshots if not p.is_file())))
            continue
        before, after = (parse_counter_lines(p.read_text(encoding="utf-8", errors="replace")) for p in snapshots)
        if not before or not after:
            rows.append(MetricRow(name=name, node=node, verdict=Verdict.SKIPPED, enforced=False,
                                  reason="no NIC counter readable on the node (no /sys/class/infiniband, "
                                         "/sys/class/net statistics or ethtool)"))
            continue
        grown = {counter_label(k): v for k, v in grown_fault_counters(before, after).items()}
        check = check_nic(f"node{node}", None, grown)
        reason = (f"{len(before)} counters read; " if check.status == "PASS" else "grew during the run: ") + \
            check.reason.replace("0 port(s) Active, ", "")
        failed = check.status == "FAIL"
        if cpu:
            reason = f"CPU run: recorded, not gated (would {check.status}); {reason}"
        verdict = Verdict.RECORD if cpu else (Verdict.FAIL if failed else Verdict.PASS)
        rows.append(MetricRow(name=name, node=node, value=sum(grown.values()), unit="errors", verdict=verdict,
                              enforced=not cpu, threshold="== 0", reason=f"{reason} | {snapshots[1].parent.name}/"))
    return rows


__all__ = ["COUNTERS_SCRIPT", "counter_label", "counter_rows", "parse_counter_lines", "take_snapshot"]
