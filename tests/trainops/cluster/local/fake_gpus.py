"""A stand-in ``nvidia-smi``: a real executable on PATH that lists GPUs as the real one does."""

from __future__ import annotations

import stat
from pathlib import Path


def fake_nvidia_smi(folder: Path, listing: str, code: int = 0) -> Path:
    """Write ``folder/nvidia-smi``, which prints ``listing`` for ``-L`` and exits ``code``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\nprintf '%s' '{listing}'\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def gpu_listing(count: int) -> str:
    """``nvidia-smi -L``'s output for ``count`` GPUs."""
    return "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})\n" for i in range(count))
