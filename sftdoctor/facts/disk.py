"""Free space on the filesystem a run's output_dir will be on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.shapes import OPT_COUNT, OPT_STR


def nearest_existing(path: Path) -> Path:
    """The folder itself, or the nearest parent that exists: the filesystem the folder will be created on."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


@fact(
    "disk_space",
    "free and total bytes of the filesystem [training] output_dir will be on (statvfs)",
    inputs=RUN_CONFIG,
    why_missing="no run config given (--config), so no output_dir",
    shape={
        "output_dir": OPT_STR,
        "probed": OPT_STR,
        "free_bytes": OPT_COUNT,
        "total_bytes": OPT_COUNT,
        "error": OPT_STR,
    },
    needs=("run",),
)
def probe_disk_space(facts, run) -> dict[str, Any] | None:
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
