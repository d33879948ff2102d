"""Free space on the filesystem a run's output_dir will be on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def nearest_existing(path: Path) -> Path:
    """The folder itself, or the nearest parent that exists: the filesystem the folder will be created on."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def probe_disk_space(facts) -> dict[str, Any] | None:
    run = facts.get("run")
    if run is None:
        return None
    output_dir = Path(run.training.output_dir)
    probed = nearest_existing(output_dir)
    try:
        st = os.statvfs(probed)
    except OSError as exc:
        return {"output_dir": str(output_dir), "probed": str(probed), "error": f"statvfs failed: {exc}"}
    # f_bavail: the blocks an unprivileged writer may use (root's reserve excluded), as `df` shows "Avail".
    return {
        "output_dir": str(output_dir),
        "probed": str(probed),
        "free_bytes": st.f_bavail * st.f_frsize,
        "total_bytes": st.f_blocks * st.f_frsize,
    }
