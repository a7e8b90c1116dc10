"""Preflight: read each node's state before anything trains, and judge it.

One small bash probe runs on every node (locally, over ssh, or under srun): it prints `key=value`
lines and never fails, so a missing tool is a reading ("absent"), not a crash. The readings are judged
here, each a `MetricRow` (PASS / FAIL / SKIPPED with the reading in the reason):

    gpus.visible     GPUs the driver lists (nvidia-smi -L, else rocm-smi / amd-smi) == GPUs per node
    gpu.driver       driver version present
    nic.link_gbps    every up InfiniBand/RoCE port (or the socket interface named in the config) at least
                     the expected speed, when an expectation is given and NICs exist
    shm.size_gib     /dev/shm large enough for NCCL's shared-memory transport and data-loader workers
    memlock          `ulimit -l` unlimited (RDMA registers pinned memory; a small limit fails NCCL IB)
    disk.free_gib    free space where logs and checkpoints go
    gpus.health      every GPU's temperature and uncorrected ECC count (nvidia-smi's query), where a GPU is used
    kernel.faults    GPU hardware faults in the kernel log (NVRM Xid, AMD RAS, ECC); Xid codes the application
                     causes (13, 31, 43) do not fail the node; SKIPPED where dmesg cannot be read
    versions         GPU driver, CUDA/ROCm and kernel release the same as on the other nodes
CVS checks none of these before training; a bad node then shows up as a slow or failed combo. A node's failed
check fails that node's own row (`node1.kernel.faults`) and puts it in `failing_nodes.txt`
(megapilot.diagnose.nodes judges the health readings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from megapilot.diagnose.nodes import HealthCheck, check_gpus, check_kernel, check_versions
from megapilot.files import human_size
from megapilot.logs.health import GPU_QUERY, GpuState, KernelFault, kernel_faults, parse_gpu_query
from megapilot.suite.results import MetricRow, Verdict

# Why these floors: NCCL's SHM transport and PyTorch data-loader workers allocate in /dev/shm; Docker's
# default of 64 MiB makes multi-GPU jobs fail with "Bus error"/"unable to write to file </torch_..."; 1 GiB
# is what the NCCL troubleshooting guide treats as the practical minimum for 8 local ranks.
MIN_SHM_GIB = 1.0
# A small run directory fills fast with per-rank logs and a checkpoint of even a tiny model.
MIN_FREE_DISK_GIB = 1.0

PROBE_SCRIPT = r"""
probe() { printf '%s=%s\n' "$1" "$2"; }
# under srun the node by SLURM's name (what `--exclude` takes; NodeName need not be the hostname)
probe host "${SLURMD_NODENAME:-$(hostname 2>/dev/null || echo unknown)}"
probe kernel_release "$(uname -r 2>/dev/null)"
if command -v nvidia-smi >/dev/null 2>&1; then
  probe gpu_vendor nvidia
  probe gpu_count "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
  probe gpu_driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)"
  probe gpu_runtime "cuda $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n1)"
  nvidia-smi --query-gpu=__GPU_QUERY__ --format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpu_query=/'
elif command -v amd-smi >/dev/null 2>&1 || command -v rocm-smi >/dev/null 2>&1; then
  probe gpu_vendor amd
  if command -v amd-smi >/dev/null 2>&1; then
    probe gpu_count "$(amd-smi list 2>/dev/null | grep -c '^GPU')"
    probe gpu_driver "$(amd-smi version 2>/dev/null | sed -n 's/.*ROCm version: *\([^ |]*\).*/\1/p' | head -n1)"
  else
    probe gpu_count "$(rocm-smi --showid 2>/dev/null | grep -cE '^GPU\[[0-9]+\]' )"
    probe gpu_driver "$(cat /sys/module/amdgpu/version 2>/dev/null)"
  fi
  [ -r /opt/rocm/.info/version ] && probe gpu_runtime "rocm $(cat /opt/rocm/.info/version)"
else
  probe gpu_vendor none
  probe gpu_count 0
fi
# The kernel's GPU fault lines (a node's Xid between jobs is invisible to the job's own log).
if kernel_log=$(dmesg 2>/dev/null); then
  probe kernel_log readable
  printf '%s\n' "$kernel_log" | grep -E 'NVRM|Xid|amdgpu|RAS|Hardware Error|ECC' | tail -n 200 | sed 's/^/kernel=/'
else
  probe kernel_log unreadable
fi
probe shm_kib "$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $2}')"
probe memlock "$(ulimit -l 2>/dev/null)"
for dir in "$@"; do
  probe_dir=$dir
  while [ ! -d "$probe_dir" ] && [ "$probe_dir" != "/" ]; do probe_dir=$(dirname "$probe_dir"); done
  probe "disk_free_kib:$dir" "$(df -Pk "$probe_dir" 2>/dev/null | awk 'NR==2 {print $4}')"
done
for port in /sys/class/infiniband/*/ports/*; do
  [ -e "$port/rate" ] || continue
  probe "ib:${port#/sys/class/infiniband/}" \
    "$(cat "$port/state" 2>/dev/null | tr -d ' ') $(cat "$port/rate" 2>/dev/null)"
done
for nic in /sys/class/net/*; do
  name=${nic##*/}
  [ "$name" = lo ] && continue
  probe "net:$name" "$(cat "$nic/operstate" 2>/dev/null) $(cat "$nic/speed" 2>/dev/null)"
done
exit 0
""".replace("__GPU_QUERY__", GPU_QUERY)


@dataclass
class NicPort:
    """One network port a node reported: an InfiniBand/RoCE port or an Ethernet interface."""

    name: str
    up: bool
    speed_gbps: float | None


@dataclass
class NodeProbe:
    """What the probe read on one node."""

    node: int
    host: str = "unknown"
    gpu_vendor: str = "none"
    gpu_count: int = 0
    gpu_driver: str = ""
    shm_gib: float | None = None
    memlock_unlimited: bool | None = None
    memlock_kib: int | None = None
    disk_free_gib: dict[str, float] = field(default_factory=dict)
    ib_ports: list[NicPort] = field(default_factory=list)
    net_ports: list[NicPort] = field(default_factory=list)
    kernel_release: str = ""
    gpu_runtime: str = ""
    gpu_query: list[str] = field(default_factory=list)  # nvidia-smi's CSV rows
    kernel_readable: bool = False
    kernel_lines: list[str] = field(default_factory=list)  # the kernel log's GPU-related lines
    error: str = ""

    def gpu_states(self) -> list[GpuState] | None:
        return parse_gpu_query("\n".join(self.gpu_query)) if self.gpu_vendor == "nvidia" else None

    def kernel_faults(self) -> list[KernelFault] | None:
        return kernel_faults(f"node{self.node} dmesg", self.kernel_lines) if self.kernel_readable else None

    def versions(self) -> dict[str, str]:
        found = {"GPU driver": self.gpu_driver, "GPU runtime": self.gpu_runtime, "kernel": self.kernel_release}
        return {key: value for key, value in found.items() if value}


@dataclass(frozen=True)
class PreflightExpectations:
    """What the suite expects of every node."""

    gpus_per_node: int
    device: str  # "cpu" or "gpu"
    expected_nic_gbps: float | None = None
    socket_interface: str | None = None  # NCCL_SOCKET_IFNAME from the config, when set
    min_shm_gib: float = MIN_SHM_GIB
    min_free_disk_gib: float = MIN_FREE_DISK_GIB


_IB_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_probe(node: int, text: str) -> NodeProbe:
    """Turn the probe's `key=value` lines into a NodeProbe (unknown keys ignored)."""
    probe = NodeProbe(node=node)
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "kernel":  # a whole kernel line, kept as printed
            probe.kernel_lines.append(value)
            continue
        value = value.strip()
        _read_value(probe, key.strip(), value)
    return probe


def _read_value(probe: NodeProbe, key: str, value: str) -> None:
    if key == "host":
        probe.host = value
    elif key == "kernel_release":
        probe.kernel_release = value
    elif key == "gpu_runtime":
        probe.gpu_runtime = value if len(value.split()) == 2 else ""  # "cuda 12.4"; "cuda" alone read nothing
    elif key == "gpu_query":
        probe.gpu_query.append(value)
    elif key == "kernel_log":
        probe.kernel_readable = value == "readable"
    elif key == "gpu_vendor":
        probe.gpu_vendor = value
    elif key == "gpu_count":
        probe.gpu_count = int(value) if value.isdigit() else 0
    elif key == "gpu_driver":
        probe.gpu_driver = value
    elif key == "shm_kib" and value.isdigit():
        probe.shm_gib = int(value) / 1024**2
    elif key == "memlock":
        probe.memlock_unlimited = value == "unlimited"
        probe.memlock_kib = int(value) if value.isdigit() else None
    elif key.startswith("disk_free_kib:") and value.isdigit():
        probe.disk_free_gib[key.partition(":")[2]] = int(value) / 1024**2
    elif key.startswith("ib:"):
        state, _, rate = value.partition(" ")
        found = _IB_RATE.search(rate)
        probe.ib_ports.append(NicPort(key[3:], "ACTIVE" in state.upper(), float(found.group(1)) if found else None))
    elif key.startswith("net:"):
        state, _, speed = value.partition(" ")
        mbps = int(speed) if speed.lstrip("-").isdigit() else -1
        probe.net_ports.append(NicPort(key[4:], state == "up", mbps / 1000 if mbps > 0 else None))


def judge(probes: list[NodeProbe], expect: PreflightExpectations) -> list[MetricRow]:
    """Every check on every node, one row each (node named in the row name when there are several)."""
    rows: list[MetricRow] = []
    reached = [probe for probe in probes if not probe.error]
    versions = {probe.node: check for probe, check in zip(
        reached, check_versions({f"node{p.node}": p.versions() for p in reached}), strict=True)}
    for probe in probes:
        prefix = f"node{probe.node}." if len(probes) > 1 else ""
        if probe.error:
            rows.append(MetricRow(name=f"{prefix}probe", verdict=Verdict.FAIL, node=probe.node,
                                  reason=f"could not read node {probe.node}: {probe.error}"))
            continue
        for row in (_gpus(probe, expect), _driver(probe, expect), _shm(probe, expect), _memlock(probe, expect),
                    *_disk(probe, expect), *_nics(probe, expect), *_health(probe, expect, versions[probe.node])):
            rows.append(row.model_copy(update={"name": prefix + row.name, "node": probe.node}))
    return rows


def _health(probe: NodeProbe, expect: PreflightExpectations, versions: HealthCheck) -> list[MetricRow]:
    """The node's own health: its GPUs (where a GPU is used), its kernel log, its versions against the others."""
    gpus = (HealthCheck(f"node{probe.node}", "gpus", "SKIPPED", "CPU run: GPU health not needed")
            if expect.device == "cpu" else check_gpus(f"node{probe.node}", probe.gpu_states(), expect.gpus_per_node))
    named = {"gpus": "gpus.health", "kernel": "kernel.faults", "versions": "versions"}
    return [MetricRow(name=named[check.check], verdict=Verdict(check.status),
                      reason=check.reason + "".join(f" | {e.text}" for e in check.evidence[:1]))
            for check in (gpus, check_kernel(f"node{probe.node}", probe.kernel_faults()), versions)]


def _gpus(probe: NodeProbe, expect: PreflightExpectations) -> MetricRow:
    name, unit = "gpus.visible", "GPUs"
    if expect.device == "cpu":
        return MetricRow(name=name, value=probe.gpu_count, unit=unit, verdict=Verdict.SKIPPED,
                         reason=f"CPU run: {probe.gpu_count} GPUs seen, none needed ({expect.gpus_per_node} ranks on "
                                "CPUs)")
    verdict = Verdict.PASS if probe.gpu_count == expect.gpus_per_node else Verdict.FAIL
    return MetricRow(name=name, value=probe.gpu_count, unit=unit, threshold=f"== {expect.gpus_per_node}",
                     verdict=verdict, reason=f"{probe.gpu_count} {probe.gpu_vendor} GPUs visible on {probe.host}, "
                                             f"{expect.gpus_per_node} expected")


def _driver(probe: NodeProbe, expect: PreflightExpectations) -> MetricRow:
    if expect.device == "cpu":
        return MetricRow(name="gpu.driver", verdict=Verdict.SKIPPED, reason="CPU run: no GPU driver needed")
    if probe.gpu_driver:
        return MetricRow(name="gpu.driver", verdict=Verdict.PASS,
                         reason=f"{probe.gpu_vendor} driver {probe.gpu_driver}")
    return MetricRow(name="gpu.driver", verdict=Verdict.FAIL,
                     reason=f"no GPU driver version could be read on {probe.host} (nvidia-smi / amd-smi / rocm-smi)")


def _shm(probe: NodeProbe, expect: PreflightExpectations) -> MetricRow:
    name = "shm.size_gib"
    if probe.shm_gib is None:
        return MetricRow(name=name, unit="GiB", verdict=Verdict.FAIL, reason="/dev/shm is not mounted")
    ok = probe.shm_gib >= expect.min_shm_gib
    return MetricRow(name=name, value=round(probe.shm_gib, 2), unit="GiB", threshold=f">= {expect.min_shm_gib:g}",
                     verdict=Verdict.PASS if ok else Verdict.FAIL,
                     reason=f"/dev/shm is {probe.shm_gib:.2f} GiB" + ("" if ok else
                            " (NCCL's shared-memory transport and data-loader workers need more; docker: --ipc host "
                            "or --shm-size)"))


def _memlock(probe: NodeProbe, expect: PreflightExpectations) -> MetricRow:
    name = "memlock"
    if probe.memlock_unlimited is None:
        return MetricRow(name=name, verdict=Verdict.SKIPPED, reason="ulimit -l could not be read")
    if probe.memlock_unlimited:
        return MetricRow(name=name, verdict=Verdict.PASS, reason="memlock unlimited")
    # Only RDMA needs pinned memory; a CPU or single-node run is fine with a limit, so it is recorded.
    needs_rdma = expect.device == "gpu" and bool(probe.ib_ports)
    return MetricRow(name=name, value=probe.memlock_kib, unit="KiB", threshold="unlimited",
                     verdict=Verdict.FAIL if needs_rdma else Verdict.RECORD,
                     reason=f"memlock limited to {probe.memlock_kib} KiB" + (
                         " (RDMA memory registration needs unlimited: ulimit -l unlimited / --ulimit memlock=-1)"
                         if needs_rdma else "; no RDMA port seen, so it does not matter here"))


def _disk(probe: NodeProbe, expect: PreflightExpectations) -> list[MetricRow]:
    rows = []
    for directory, free in probe.disk_free_gib.items():
        ok = free >= expect.min_free_disk_gib
        rows.append(MetricRow(name=f"disk.free_gib[{directory}]", value=round(free, 2), unit="GiB",
                              threshold=f">= {expect.min_free_disk_gib:g}",
                              verdict=Verdict.PASS if ok else Verdict.FAIL,
                              reason=f"{human_size(free * 1024**3)} free for {directory}"
                                     + ("" if ok else f"; needs {expect.min_free_disk_gib:g} GiB for its logs and "
                                                      "checkpoints")))
    return rows


def _nics(probe: NodeProbe, expect: PreflightExpectations) -> list[MetricRow]:
    ports = [p for p in probe.ib_ports if p.up]
    if expect.socket_interface:
        wanted = set(expect.socket_interface.replace("^", "").split(","))
        ports += [p for p in probe.net_ports if p.name in wanted]
    if expect.expected_nic_gbps is None:
        return [MetricRow(name="nic.link_gbps", verdict=Verdict.SKIPPED,
                          reason=f"no expected NIC speed in the config; {len(ports)} RDMA/selected ports seen"
                                 + _port_list(ports))]
    if not ports:
        return [MetricRow(name="nic.link_gbps", verdict=Verdict.SKIPPED,
                          reason="no active InfiniBand/RoCE port and no NCCL_SOCKET_IFNAME interface on this node")]
    rows = []
    for port in ports:
        speed = port.speed_gbps
        ok = port.up and speed is not None and speed >= expect.expected_nic_gbps
        rows.append(MetricRow(name=f"nic.link_gbps[{port.name}]", value=speed, unit="Gb/s",
                              threshold=f">= {expect.expected_nic_gbps:g}",
                              verdict=Verdict.PASS if ok else Verdict.FAIL,
                              reason=f"{port.name} {'up' if port.up else 'down'} at {speed if speed else '?'} Gb/s"))
    return rows


def _port_list(ports: list[NicPort]) -> str:
    if not ports:
        return ""
    return " (" + ", ".join(f"{p.name} {p.speed_gbps or '?'} Gb/s" for p in ports) + ")"


__all__ = [
    "MIN_FREE_DISK_GIB",
    "MIN_SHM_GIB",
    "PROBE_SCRIPT",
    "NicPort",
    "NodeProbe",
    "PreflightExpectations",
    "judge",
    "parse_probe",
]
