"""Installed distributions, read from their metadata folders on sys.path.

Equivalent to importlib.metadata's `version()` and `entry_points()` for what sftdoctor needs,
without its import cost (it pulls in the email package: ~35 ms of the CLI's start-up).
A wheel installs `{name}-{version}.dist-info` (PEP 376/427); setuptools' develop installs leave
`{name}.egg-info` whose PKG-INFO holds the version. As with importlib, the first match on
sys.path wins. A test compares the results with importlib.metadata on the installed stack.
"""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache
from pathlib import Path


def normalize(name: str) -> str:
    """PEP 503 name normalisation: "Flash_Attn" and "flash-attn" are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


@lru_cache(maxsize=1)
def _metadata_dirs() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for entry in sys.path:
        folder = entry or os.getcwd()
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                found.setdefault(normalize(name.split("-")[0].rsplit(".", 1)[0]), Path(folder, name))
    return found


def _header_version(path: Path) -> str | None:
    """The Version: header of METADATA / PKG-INFO (egg-info may be a folder or a single file)."""
    file = path if path.is_file() else next((path / n for n in ("PKG-INFO", "METADATA") if (path / n).is_file()), None)
    if file is None:
        return None
    try:
        with open(file, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break  # end of the headers
    except OSError:
        return None
    return None


def version(name: str) -> str | None:
    path = _metadata_dirs().get(normalize(name))
    if path is None:
        return None
    parts = path.name.rsplit(".", 1)[0].split("-")
    if path.suffix == ".dist-info" and len(parts) >= 2:
        return parts[1]
    return _header_version(path)


def requires(name: str) -> list[str] | None:
    """The Requires-Dist headers of a distribution's METADATA (importlib.metadata.requires' answer); None when
    it is not installed."""
    path = _metadata_dirs().get(normalize(name))
    if path is None:
        return None
    file = path if path.is_file() else next((path / n for n in ("METADATA", "PKG-INFO") if (path / n).is_file()), None)
    found: list[str] = []
    try:
        with open(file, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # end of the headers
                if line.startswith("Requires-Dist:"):
                    found.append(line.split(":", 1)[1].strip())
    except (OSError, TypeError):  # TypeError: no metadata file at all
        return []
    return found


def direct_url(name: str) -> str | None:
    """The URL pip installed a distribution from (PEP 610 direct_url.json: a wheel file or link given to pip;
    absent for an install from an index)."""
    import json

    path = _metadata_dirs().get(normalize(name))
    try:
        url = json.loads((path / "direct_url.json").read_text(encoding="utf-8")).get("url") if path else None
    except (OSError, ValueError, AttributeError):
        return None
    return url if isinstance(url, str) else None


def entry_points(group: str) -> list[tuple[str, str, str]]:
    """(name, "module:attr" value, distribution) for every entry point in `group`."""
    found = []
    for dist, path in _metadata_dirs().items():
        try:
            text = (path / "entry_points.txt").read_text(encoding="utf-8")
        except OSError:
            continue
        section = None
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
            elif section == group and "=" in line and not line.startswith(("#", ";")):
                key, value = line.split("=", 1)
                found.append((key.strip(), value.strip(), dist))
    return found


def load_entry_point(value: str):
    """Import "module:attr.sub" (or "module") as importlib.metadata.EntryPoint.load() does."""
    import importlib

    module_name, _, attrs = value.partition(":")
    obj = importlib.import_module(module_name.strip())
    for attr in filter(None, attrs.split("[")[0].strip().split(".")):
        obj = getattr(obj, attr)
    return obj
