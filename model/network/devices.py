"""Where the recogniser runs: CUDA in bfloat16 where a GPU is present, else CPU in float32."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def resolve_device(device: str = "auto", dtype: str | None = None) -> tuple[str, torch.dtype]:
    """("auto" | "cpu" | "cuda[:n]", dtype name or None) -> (device, dtype). The default dtype is
    bfloat16 on CUDA and float32 on CPU, where bfloat16 matmuls are slow."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no CUDA device is available")
    if dtype is None:
        return device, torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return device, DTYPES[dtype]
