"""What the CPU offers for low-precision inference, read from /proc/cpuinfo."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

__all__ = ["CpuInfo", "cpu_info"]


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores: int
    flags: frozenset[str] = field(default_factory=frozenset)

    @property
    def vnni(self) -> bool:
        """INT8 dot products (VNNI): signed per-channel INT8 weights are fast."""
        return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & self.flags)

    @property
    def bf16(self) -> bool:
        return bool({"avx512_bf16", "amx_bf16"} & self.flags)

    def as_dict(self) -> dict[str, object]:
        wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
        return {
            "model": self.model,
            "cores": self.cores,
            "flags": [f for f in wanted if f in self.flags],
            "vnni": self.vnni,
            "bf16": self.bf16,
        }


def cpu_info() -> CpuInfo:
    model, flags = platform.processor() or "unknown", frozenset[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
    except OSError:
        pass
    return CpuInfo(model, os.cpu_count() or 1, flags)
