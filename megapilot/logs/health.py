"""What a node's own tools say about its health, read into typed facts (the checks and their verdicts are
`megapilot.diagnose.nodes`):

- `nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,temperature.gpu,clocks.sm,
  ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits` -> `GpuState` rows (`GPU_QUERY`);
- `dmesg` -> the lines the error signatures call a GPU hardware fault (NVRM Xid, AMD RAS, ECC), with the Xid code;
- `ibstat` -> each HCA port's state and rate;
- NIC error counters (`ethtool -S`, or /sys/class/{net,infiniband}/.../counters) before and after a run -> the
  counters that grew.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from megapilot.logs.records import Evidence
from megapilot.logs.signatures import match_line

GPU_QUERY = ("index,name,pci.bus_id,driver_version,temperature.gpu,clocks.sm,"
             "ecc.errors.uncorrected.volatile.total")


@dataclass(frozen=True, slots=True)
class GpuState:
    index: int
    name: str
    bus_id: str
    driver_version: str
    temperature_c: float | None
    sm_clock_mhz: float | None
    uncorrected_ecc: int | None  # None where the GPU reports "[N/A]" (ECC off, or a consumer part)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_gpu_query(text: str) -> list[GpuState]:
    """`nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` output, one GPU a line."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 7 or not cells[0].isdigit():
            continue
        ecc = _number(cells[6])
        gpus.append(GpuState(int(cells[0]), cells[1], cells[2], cells[3], _number(cells[4]), _number(cells[5]),
                             int(ecc) if ecc is not None else None))
    return gpus


@dataclass(frozen=True, slots=True)
class KernelFault:
    """A dmesg line the error signatures call a GPU hardware fault."""

    signature: str
    xid: int | None
    evidence: Evidence


# `NVRM: Xid (PCI:0000:9a:00): 79, ...`: the code a line names (diagnose's rules read it with this one pattern too)
XID_CODE = re.compile(r"\bXid\b(?: \(PCI:[^)]*\))?:? (\d+)")


def kernel_faults(file: str, lines: Iterable[str]) -> list[KernelFault]:
    """The GPU hardware faults among the kernel's lines (one signature table for logs and dmesg alike)."""
    faults = []
    for number, raw in enumerate(lines, start=1):
        text = raw.rstrip("\n")
        signature = match_line(text)
        if signature is None or signature.category != "gpu_hw_fault":
            continue
        xid = XID_CODE.search(text)
        faults.append(KernelFault(signature.name, int(xid.group(1)) if xid else None,
                                  Evidence(file, number, text.strip())))
    return faults


@dataclass(frozen=True, slots=True)
class HcaPort:
    device: str
    port: int
    state: str  # "Active", "Down", "Initializing", ...
    rate_gbps: float | None


_CA = re.compile(r"^CA '([^']+)'")
_PORT = re.compile(r"^\s*Port (\d+):")
_STATE = re.compile(r"^\s*State:\s*(\S+)")
_RATE = re.compile(r"^\s*Rate:\s*([\d.]+)")


def parse_ibstat(text: str) -> list[HcaPort]:
    """`ibstat` output: every port of every HCA."""
    ports: list[HcaPort] = []
    device, port, state, rate = "", 0, "", None
    for line in text.splitlines() + ["CA 'end'"]:
        ca, found = _CA.match(line), _PORT.match(line)
        if ca or found:
            if state:
                ports.append(HcaPort(device, port, state, rate))
            state, rate = "", None
            if ca:
                device = ca.group(1)
            elif found:
                port = int(found.group(1))
        elif match := _STATE.match(line):
            state = match.group(1)
        elif match := _RATE.match(line):
            rate = float(match.group(1))
    return ports


# Counters that count faults, by the words in their names across mlx5 (`ethtool -S`), bnxt, and the
# InfiniBand port counters (`symbol_error`, `link_downed`, `port_rcv_errors`, `port_xmit_discards`).
_FAULT_COUNTER = re.compile(r"err|drop|discard|symbol|link_downed|timeout|retry_exceeded|out_of_buffer",
                            re.IGNORECASE)


def parse_counters(text: str) -> dict[str, int]:
    """`name: value` lines (ethtool -S) or `name value` (a sysfs dump made with `grep . counters/*`)."""
    counters = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([\w./:-]+?)\s*[:\s]\s*(\d+)\s*$", line)
        if match:
            counters[match.group(1).rsplit("/", 1)[-1]] = int(match.group(2))
    return counters


def grown_fault_counters(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """The fault counters that grew during the run, by how much."""
    return {name: after[name] - before.get(name, 0) for name in sorted(after)
            if _FAULT_COUNTER.search(name) and after[name] > before.get(name, 0)}
