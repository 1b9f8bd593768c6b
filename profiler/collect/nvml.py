"""NVIDIA GPU telemetry through NVML (nvidia-ml-py), behind a thin adapter.

:class:`NvmlReader` is the only code that calls NVML; it returns plain dicts of raw values.
:func:`to_row` turns one raw sample into a telemetry row and is pure, so it is tested with
samples on machines that have no GPU. Any query a device does not support reads as None.
"""

from __future__ import annotations

from typing import Any

# NVML's clocks-event (throttle) reason bits, from nvml.h, with the names people search for.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that cost performance; idle and application clock settings are not a slowdown.
SLOWDOWN_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
KIB = 1024


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no driver, no GPU, or nvidia-ml-py missing)."""


class NvmlReader:
    """Reads raw NVML values for every visible GPU."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from e
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(str(e)) from e
        if count == 0:
            raise NvmlUnavailable("NVML sees no GPU")
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.driver = _text(pynvml.nvmlSystemGetDriverVersion())

    def read(self) -> list[dict[str, Any]]:
        """One raw sample per device."""
        return [self._read_device(i, h) for i, h in enumerate(self.handles)]

    def _read_device(self, index: int, h: Any) -> dict[str, Any]:
        n = self.nvml
        util = self._try(n.nvmlDeviceGetUtilizationRates, h)
        mem = self._try(n.nvmlDeviceGetMemoryInfo, h)
        nvlink = self._try(n.nvmlDeviceGetFieldValues, h,
                           [n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX])
        return {
            "index": index,
            "uuid": _text(self._try(n.nvmlDeviceGetUUID, h)),
            "utilization": None if util is None else {"gpu": util.gpu, "memory": util.memory},
            "memory": None if mem is None else {"used": mem.used, "total": mem.total},
            "power_mw": self._try(n.nvmlDeviceGetPowerUsage, h),
            "temperature_c": self._try(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "clocks_mhz": {"sm": self._try(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
                           "mem": self._try(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM)},
            "throttle_reasons": self._try(n.nvmlDeviceGetCurrentClocksThrottleReasons, h),
            "pcie_kib_s": {"tx": self._try(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES),
                           "rx": self._try(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)},
            "nvlink_kib_total": None if nvlink is None else {
                "tx": _field_value(nvlink[0]), "rx": _field_value(nvlink[1])},
        }

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None  # not supported on this device or driver


def to_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A telemetry row (SI units, decoded throttle reasons) from one raw device sample."""
    util = raw.get("utilization") or {}
    mem = raw.get("memory") or {}
    clocks = raw.get("clocks_mhz") or {}
    pcie = raw.get("pcie_kib_s") or {}
    nvlink = raw.get("nvlink_kib_total") or {}
    reasons = raw.get("throttle_reasons")
    return {
        "kind": "gpu",
        "device": raw["index"],
        "uuid": _normalize_uuid(raw.get("uuid")),
        "gpu_util_percent": util.get("gpu"),
        "mem_util_percent": util.get("memory"),
        "mem_used_bytes": mem.get("used"),
        "mem_total_bytes": mem.get("total"),
        "power_w": None if raw.get("power_mw") is None else raw["power_mw"] / 1000,
        "temperature_c": raw.get("temperature_c"),
        "sm_clock_mhz": clocks.get("sm"),
        "mem_clock_mhz": clocks.get("mem"),
        "throttle_reasons": reasons,
        "throttle": None if reasons is None else ",".join(
            name for bit, name in THROTTLE_REASONS.items() if reasons & bit),
        "throttled": None if reasons is None else bool(reasons & SLOWDOWN_REASONS),
        "pcie_tx_bytes_s": _scale(pcie.get("tx"), KIB),
        "pcie_rx_bytes_s": _scale(pcie.get("rx"), KIB),
        "nvlink_tx_bytes_total": _scale(nvlink.get("tx"), KIB),
        "nvlink_rx_bytes_total": _scale(nvlink.get("rx"), KIB),
    }


def _normalize_uuid(uuid: str | None) -> str | None:
    """NVML says ``GPU-<uuid>``, torch says ``<uuid>``: compare them without the prefix."""
    return None if uuid is None else uuid.removeprefix("GPU-")


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _field_value(field: Any) -> int | None:
    if getattr(field, "nvmlReturn", 0) != 0:
        return None
    return int(field.value.ullVal)
