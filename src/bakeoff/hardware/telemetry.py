"""GPU telemetry of one load cell: memory, utilization, power and energy of the server's own GPUs.

Why it exists: a node may hold more GPUs than the server was given, and
summing every GPU (what ``memory.gpu_used_bytes`` does) charges a cell for its
neighbours. So the devices are the server's ``CUDA_VISIBLE_DEVICES``, mapped to
NVML handles by UUID: CUDA and NVML number GPUs differently unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (which bakeoff sets for every server, see
``bakeoff.hardware.gpu``), and UUID entries name a device whatever the order.

Energy comes from NVML's total-energy counter (millijoules since the driver
loaded), read right before the first measured request and right after the
last one, so warm-up and model load are excluded. The counter is an unsigned
64-bit integer: a smaller second reading is either a wrap (the delta modulo
2**64 is plausible for the board's power limit over the window) or a reset
(driver reload: the delta is unknowable). A reset, or a GPU without the
counter (pre-Volta), falls back to integrating the sampled power draw, and
``energy_source`` says which was used. The counter measures the whole board,
idle power included: with one server per GPU (how bakeoff schedules) that is
the energy the serving cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from bakeoff.errors import BakeoffError

COUNTER_MODULUS = 2**64  # nvmlDeviceGetTotalEnergyConsumption returns an unsigned long long (mJ)
FALLBACK_POWER_LIMIT_W = 2000.0  # plausibility bound when NVML cannot tell a board's power limit
COLUMNS = ["peak_gpu_bytes", "gpu_util_pct", "avg_power_w", "energy_j", "energy_source", "joules_per_output_token",
           "gpu_uuids", "telemetry_window_s"]
# The GPUs themselves as NVML names them (what the cell ran on, beside the config's name ``hardware``); the node's
# state when the cell starts (its fingerprint beside the GPU UUIDs) and its clocks over the window: what to look
# at when one block's cell is an outlier.
FINGERPRINT_COLUMNS = ["gpu_name", "gpu_count", "gpu_memory_bytes",
                       "gpu_driver", "gpu_power_limit_w", "gpu_sm_clock_start_mhz", "gpu_mem_clock_start_mhz",
                       "gpu_temp_start_c", "gpu_sm_clock_mean_mhz", "gpu_sm_clock_min_mhz"]


class TelemetryError(BakeoffError):
    """The visible-devices list names a GPU NVML does not have."""


def parse_visible(value: str | None) -> list[str] | None:
    """Entries of a ``CUDA_VISIBLE_DEVICES`` value, as CUDA reads it.

    ``None`` (unset) means every GPU; an empty string means none. CUDA stops at
    the first entry that is neither an index nor a ``GPU-``/``MIG-`` UUID
    (prefix), ignoring the rest, and so does this.
    """
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        e = raw.strip()
        if e.isdigit() or e.startswith(("GPU-", "MIG-")):
            out.append(e)
        else:
            break
    return out


def resolve_uuids(visible: str | None, uuids_by_index: list[str], device_order: str | None) -> list[str]:
    """UUIDs (NVML's) of the GPUs a process with this ``CUDA_VISIBLE_DEVICES`` sees, in its CUDA order.

    ``uuids_by_index`` lists NVML's devices in NVML (PCI bus) order. An index
    entry means NVML's index only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; with
    several GPUs and CUDA's default order (fastest first) it is ambiguous and
    refused rather than guessed.
    """
    entries = parse_visible(visible)
    if entries is None:
        entries = [str(i) for i in range(len(uuids_by_index))]
    out: list[str] = []
    for e in entries:
        if e.isdigit():
            if len(uuids_by_index) > 1 and (device_order or "FASTEST_FIRST") != "PCI_BUS_ID":
                raise TelemetryError(f"CUDA_VISIBLE_DEVICES index {e} is ambiguous without CUDA_DEVICE_ORDER=PCI_BUS_ID "
                                     f"on a node with {len(uuids_by_index)} GPUs")
            i = int(e)
            if i >= len(uuids_by_index):
                raise TelemetryError(f"CUDA_VISIBLE_DEVICES names GPU {i}; NVML has {len(uuids_by_index)}")
            uuid = uuids_by_index[i]
        else:
            matches = [u for u in uuids_by_index if u.startswith(e)]
            if len(matches) != 1:
                raise TelemetryError(f"CUDA_VISIBLE_DEVICES entry {e!r} matches {len(matches)} of NVML's GPUs "
                                     f"({', '.join(uuids_by_index)})")
            uuid = matches[0]
        if uuid not in out:
            out.append(uuid)
    return out


def energy_delta_j(before_mj: int, after_mj: int, elapsed_s: float, power_limit_w: float) -> float | None:
    """Joules between two readings of NVML's total-energy counter; ``None`` if the counter was reset.

    A smaller second reading is a wrap when the modular delta could have been
    drawn at the board's power limit over the window (with 50 % slack), else a
    reset, whose delta cannot be known.
    """
    if after_mj >= before_mj:
        return (after_mj - before_mj) / 1000.0
    wrapped = (after_mj + COUNTER_MODULUS - before_mj) / 1000.0
    if wrapped <= 1.5 * power_limit_w * max(elapsed_s, 0.0):
        return wrapped
    return None


def _nvml() -> ModuleType | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no NVIDIA driver or library: not a GPU node
        return None


def _uuid(nvml: Any, handle: Any) -> str:
    u = nvml.nvmlDeviceGetUUID(handle)
    return u.decode() if isinstance(u, bytes) else str(u)


def server_gpus(nvml: Any, env: Mapping[str, str]) -> list[tuple[str, Any]]:
    """(UUID, NVML handle) of each GPU a server started with ``env`` may use."""
    uuids = [_uuid(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    chosen = resolve_uuids(env.get("CUDA_VISIBLE_DEVICES"), uuids, env.get("CUDA_DEVICE_ORDER"))
    return [(u, nvml.nvmlDeviceGetHandleByUUID(u)) for u in chosen]


@dataclass
class _Device:
    uuid: str
    handle: Any
    power_limit_w: float
    energy_before_mj: int | None = None


@dataclass
class GpuWindow:
    """Samples the server's GPUs between ``start()`` and ``stop()`` (the cell's measured window).

    A background thread reads memory, utilization and power every
    ``interval_s``; the energy counter is read at both ends.
    """

    env: Mapping[str, str]
    interval_s: float = 0.2
    nvml: Any = None
    devices: list[_Device] = field(default_factory=list)
    samples: int = 0
    peak_bytes: int = 0
    util_sum: float = 0.0
    power_integral_j: float = 0.0
    t0: float = 0.0
    t1: float = 0.0
    after: list[int | None] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    sm_clocks: list[float] = field(default_factory=list)
    _last: tuple[float, float] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> GpuWindow:
        self.nvml = self.nvml or _nvml()
        if self.nvml is None:
            return self
        nv = self.nvml
        for uuid, h in server_gpus(nv, self.env):
            try:
                limit = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            except Exception:
                limit = FALLBACK_POWER_LIMIT_W
            self.devices.append(_Device(uuid, h, limit))
        self.fingerprint = self._fingerprint()
        self._sample()  # a first reading, so even a short window has one
        for d in self.devices:
            d.energy_before_mj = self._energy(d)
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gpu-telemetry")
        self._thread.start()
        return self

    def _read(self, fn: str, *args: Any) -> Any:
        """One optional NVML reading: None where this NVML or GPU does not answer it."""
        try:
            v = getattr(self.nvml, fn)(*args)
        except Exception:
            return None
        return v.decode() if isinstance(v, bytes) else v

    def _per_device(self, fn: str, *args: Any) -> list[Any] | None:
        vals = [self._read(fn, d.handle, *args) for d in self.devices]
        return None if any(v is None for v in vals) else vals

    def _fingerprint(self) -> dict[str, Any]:
        """The GPUs (name, count, memory per GPU), driver, power limit, clocks and temperature at the cell's start
        (distinct names joined by `` + ``; the list's max/min of the rest)."""
        nv = self.nvml
        sm = self._per_device("nvmlDeviceGetClockInfo", getattr(nv, "NVML_CLOCK_SM", 1))
        mem = self._per_device("nvmlDeviceGetClockInfo", getattr(nv, "NVML_CLOCK_MEM", 2))
        temp = self._per_device("nvmlDeviceGetTemperature", getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        names = self._per_device("nvmlDeviceGetName")
        memory = self._per_device("nvmlDeviceGetMemoryInfo")
        return {"gpu_name": " + ".join(dict.fromkeys(str(n) for n in names)) if names else None,
                "gpu_count": len(self.devices),
                "gpu_memory_bytes": min(int(m.total) for m in memory) if memory else None,
                "gpu_driver": self._read("nvmlSystemGetDriverVersion"),
                "gpu_power_limit_w": min(d.power_limit_w for d in self.devices) if self.devices else None,
                "gpu_sm_clock_start_mhz": min(sm) if sm else None,
                "gpu_mem_clock_start_mhz": min(mem) if mem else None,
                "gpu_temp_start_c": max(temp) if temp else None}

    def _energy(self, d: _Device) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(d.handle))
        except Exception:  # not supported on this GPU
            return None

    def _sample(self) -> None:
        nv = self.nvml
        used = sum(nv.nvmlDeviceGetMemoryInfo(d.handle).used for d in self.devices)
        util = [nv.nvmlDeviceGetUtilizationRates(d.handle).gpu for d in self.devices]
        power_w = sum(nv.nvmlDeviceGetPowerUsage(d.handle) for d in self.devices) / 1000.0
        now = time.monotonic()
        if self._last is not None:
            t_prev, p_prev = self._last
            self.power_integral_j += 0.5 * (p_prev + power_w) * (now - t_prev)
        self._last = (now, power_w)
        self.peak_bytes = max(self.peak_bytes, int(used))
        sm = self._per_device("nvmlDeviceGetClockInfo", getattr(nv, "NVML_CLOCK_SM", 1))
        if sm:
            self.sm_clocks.append(float(min(sm)))
        self.util_sum += sum(util) / len(util) if util else 0.0
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> GpuWindow:
        if self.nvml is None or self._thread is None:
            return self
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        self.t1 = time.monotonic()
        self.after = [self._energy(d) for d in self.devices]
        return self

    def columns(self, output_tokens: int | None) -> dict[str, Any]:
        """The cell's telemetry columns (empty without NVML)."""
        if self.nvml is None or not self.devices:
            return {}
        window = self.t1 - self.t0
        energy: float | None = 0.0
        source = "nvml_total_energy_counter"
        for d, after in zip(self.devices, self.after, strict=True):
            delta = (None if d.energy_before_mj is None or after is None
                     else energy_delta_j(d.energy_before_mj, after, window, d.power_limit_w))
            if delta is None:
                energy = None
                break
            energy += delta  # type: ignore[operator]
        if energy is None:
            energy, source = self.power_integral_j, "sampled_power_integral"
        return {
            "peak_gpu_bytes": self.peak_bytes,
            "gpu_util_pct": self.util_sum / self.samples if self.samples else None,
            "avg_power_w": energy / window if window > 0 else None,
            "energy_j": energy,
            "energy_source": source,
            "joules_per_output_token": energy / output_tokens if output_tokens else None,
            "gpu_uuids": [d.uuid for d in self.devices],
            "telemetry_window_s": window,
            **self.fingerprint,
            "gpu_sm_clock_mean_mhz": sum(self.sm_clocks) / len(self.sm_clocks) if self.sm_clocks else None,
            "gpu_sm_clock_min_mhz": min(self.sm_clocks) if self.sm_clocks else None,
        }
