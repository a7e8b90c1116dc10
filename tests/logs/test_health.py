"""Node tools' output read into facts (the formats of nvidia-smi, dmesg, ibstat, ethtool; values are fakes)."""

from __future__ import annotations

from pathlib import Path

from megapilot.logs.health import grown_fault_counters, kernel_faults, parse_counters, parse_gpu_query, parse_ibstat

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


def test_gpu_query_rows_with_not_available_ecc():
    gpus = parse_gpu_query((DATA / "fake_nvidia_smi.csv").read_text())
    assert len(gpus) == 8 and gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].driver_version == "550.90.07"
    assert (gpus[2].temperature_c, gpus[2].sm_clock_mhz, gpus[2].uncorrected_ecc) == (92.0, 1410.0, 3)
    assert gpus[6].uncorrected_ecc is None


def test_kernel_faults_name_the_xid_and_skip_ordinary_lines():
    faults = kernel_faults("dmesg", (DATA / "fake_dmesg_xid79.txt").read_text().splitlines())
    assert [f.xid for f in faults if f.xid is not None] == [79]
    assert all(f.evidence.text.startswith("[Sat Dec") for f in faults)
    assert not any("mlx5_pcie_event" in f.evidence.text or "loading NVIDIA" in f.evidence.text for f in faults)


def test_ibstat_ports_with_state_and_rate():
    ports = parse_ibstat((DATA / "fake_ibstat.txt").read_text())
    assert [(p.device, p.port, p.state, p.rate_gbps) for p in ports] == [
        ("mlx5_0", 1, "Active", 400.0), ("mlx5_1", 1, "Down", 10.0), ("mlx5_2", 1, "Active", 200.0)]


def test_only_fault_counters_that_grew_are_reported():
    ethtool = "NIC statistics:\n     rx_packets: {}\n     rx_crc_errors_phy: {}\n     tx_discards_phy: 4\n"
    before, after = parse_counters(ethtool.format(100, 0)), parse_counters(ethtool.format(900, 7))
    assert grown_fault_counters(before, after) == {"rx_crc_errors_phy": 7}
    sysfs = parse_counters("/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error:3\n")
    assert sysfs == {"symbol_error": 3}
