"""GPU telemetry: CUDA_VISIBLE_DEVICES -> NVML handles by UUID, and the energy-counter arithmetic.

No GPU here, so NVML itself is replaced by ``HandWrittenNvml`` below: a hand-written
stand-in that answers NVML's calls from a fixed device inventory (the UUID of
an H200 node comes from runs/h200-llamacpp-probe-2026-12-03/probe.json, the others are
hand-written). What is tested is bakeoff's mapping and arithmetic, not NVML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from bakeoff.hardware.telemetry import (
    COUNTER_MODULUS,
    GpuWindow,
    TelemetryError,
    energy_delta_j,
    parse_visible,
    resolve_uuids,
    server_gpus,
)

ROOT = Path(__file__).resolve().parents[1]
H200_UUID = next(g["uuid"] for g in json.loads((ROOT / "runs/h200-llamacpp-probe-2026-12-03/probe.json").read_text())["gpus"])
# Hand-written: four GPUs in NVML (PCI bus) order; the first is the H200, the others H100s (names and totals as
# NVML reports them: runs/h200-llamacpp-probe-2026-12-03/probe.json, runs/h100-seed-2026-12-06/hardware.json).
NAMES = ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
TOTAL_MIB = [143771, 81559, 81559, 81559]
UUIDS = [H200_UUID, "GPU-11111111-2222-3333-4444-555555555555", "GPU-11119999-0000-0000-0000-000000000000",
         "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]


@dataclass
class _Mem:
    used: int
    total: int = 0


@dataclass
class _Util:
    gpu: int


class HandWrittenNvml:
    """Hand-written NVML stand-in: per-device memory, utilization, power and a scripted energy counter."""

    def __init__(self, uuids: list[str], energy_mj: dict[str, list[int]] | None = None) -> None:
        self.uuids = uuids
        self.energy = {u: list(v) for u, v in (energy_mj or {}).items()}

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (NVML's names)
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return self.uuids[i]

    def nvmlDeviceGetUUID(self, h: str) -> bytes:  # noqa: N802 (older nvidia-ml-py returns bytes)
        return h.encode()

    def nvmlDeviceGetHandleByUUID(self, u: str) -> str:  # noqa: N802
        assert u in self.uuids
        return u

    def nvmlDeviceGetMemoryInfo(self, h: str) -> _Mem:  # noqa: N802
        i = self.uuids.index(h)
        return _Mem(used=(i + 1) * 10**9, total=TOTAL_MIB[i] << 20)

    def nvmlDeviceGetName(self, h: str) -> bytes:  # noqa: N802 (older nvidia-ml-py returns bytes)
        return NAMES[self.uuids.index(h)].encode()

    def nvmlDeviceGetUtilizationRates(self, h: str) -> _Util:  # noqa: N802
        return _Util(gpu=50)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:  # noqa: N802
        return 300_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:  # noqa: N802
        return 700_000  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:  # noqa: N802
        seq = self.energy.get(h)
        if not seq:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return seq.pop(0) if len(seq) > 1 else seq[0]


def test_parse_visible_follows_cuda_rules():
    assert parse_visible(None) is None
    assert parse_visible("") == []
    assert parse_visible("1, 0") == ["1", "0"]
    # CUDA stops at the first invalid entry and ignores the rest
    assert parse_visible("0,x,1") == ["0"]
    assert parse_visible("GPU-1111,MIG-abc") == ["GPU-1111", "MIG-abc"]


def test_indices_map_to_uuids_in_pci_order_only():
    assert resolve_uuids("2,0", UUIDS, "PCI_BUS_ID") == [UUIDS[2], UUIDS[0]]
    assert resolve_uuids(None, UUIDS, "PCI_BUS_ID") == UUIDS
    with pytest.raises(TelemetryError, match="ambiguous"):
        resolve_uuids("1", UUIDS, None)
    # one GPU: index 0 is that GPU in any order
    assert resolve_uuids("0", UUIDS[:1], None) == [H200_UUID]
    with pytest.raises(TelemetryError, match="NVML has 4"):
        resolve_uuids("7", UUIDS, "PCI_BUS_ID")


def test_uuid_entries_and_prefixes():
    assert resolve_uuids(H200_UUID, UUIDS, None) == [H200_UUID]
    assert resolve_uuids("GPU-aaaa", UUIDS, None) == [UUIDS[3]]
    with pytest.raises(TelemetryError, match="matches 2"):
        resolve_uuids("GPU-1111", UUIDS, None)  # two UUIDs start so
    assert resolve_uuids("3,GPU-aaaaaaaa", UUIDS, "PCI_BUS_ID") == [UUIDS[3]]  # the same GPU twice counts once


def test_server_gpus_samples_only_the_servers_devices():
    nv = HandWrittenNvml(UUIDS)
    got = server_gpus(nv, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert got == [(UUIDS[1], UUIDS[1])]


def test_energy_delta_normal_wrap_reset():
    assert energy_delta_j(1_000, 51_000, elapsed_s=1.0, power_limit_w=700) == pytest.approx(50.0)
    # wrap: 100 J drawn across the 2**64 boundary in 1 s, plausible under a 700 W limit
    before = COUNTER_MODULUS - 40_000
    assert energy_delta_j(before, 60_000, elapsed_s=1.0, power_limit_w=700) == pytest.approx(100.0)
    # reset (driver reload): the counter restarts near 0 from a value far from the boundary
    assert energy_delta_j(5_000_000_000, 2_000, elapsed_s=1.0, power_limit_w=700) is None


def _window(nv: HandWrittenNvml, visible: str) -> GpuWindow:
    w = GpuWindow({"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, interval_s=0.01, nvml=nv)
    w.start()
    return w.stop()


def test_window_energy_from_the_counter_of_its_gpus_only():
    nv = HandWrittenNvml(UUIDS, {UUIDS[0]: [1_000_000, 1_600_000], UUIDS[1]: [0, 999_000_000]})
    cols = _window(nv, "0").columns(output_tokens=300)
    assert cols["energy_source"] == "nvml_total_energy_counter"
    assert cols["energy_j"] == pytest.approx(600.0)  # GPU 1's counter is not the server's
    assert cols["joules_per_output_token"] == pytest.approx(2.0)
    assert cols["peak_gpu_bytes"] == 10**9 and cols["gpu_uuids"] == [H200_UUID]
    assert cols["gpu_util_pct"] == pytest.approx(50.0)


def test_window_falls_back_to_power_integral_on_reset():
    nv = HandWrittenNvml(UUIDS, {UUIDS[2]: [7_000_000_000, 5]})
    cols = _window(nv, "2").columns(output_tokens=10)
    assert cols["energy_source"] == "sampled_power_integral"
    # 300 W sampled over the window
    assert cols["energy_j"] == pytest.approx(300.0 * cols["telemetry_window_s"], rel=0.05)
    assert cols["avg_power_w"] == pytest.approx(300.0, rel=0.05)


def test_window_names_the_servers_gpus_as_nvml_does():
    """The rows carry the GPUs themselves (name, count, memory each), whatever the hardware config says."""
    nv = HandWrittenNvml(UUIDS)
    cols = _window(nv, "2,1").columns(output_tokens=1)
    assert cols["gpu_name"] == "NVIDIA H100 80GB HBM3" and cols["gpu_count"] == 2
    assert cols["gpu_memory_bytes"] == 81559 << 20
    mixed = _window(HandWrittenNvml(UUIDS), "0,1").columns(output_tokens=1)
    assert mixed["gpu_name"] == "NVIDIA H200 + NVIDIA H100 80GB HBM3" and mixed["gpu_memory_bytes"] == 81559 << 20
