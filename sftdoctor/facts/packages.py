"""Installed package versions, read from metadata and source files without importing them."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.distributions import direct_url
from sftdoctor.facts.distributions import version as _version
from sftdoctor.facts.shapes import OPT_BOOL, OPT_STR, OPT_VERSION

# Distribution names as published on PyPI.
PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "datasets",
    "deepspeed",
    "flash-attn",
    "liger-kernel",
    "peft",
    "lm_eval",
    "bitsandbytes",
    "triton",
    "nvidia-ml-py",
    "pynvml",
    "nvidia-nccl-cu12",  # the NCCL that torch's CUDA wheels load
    "nvidia-nccl-cu11",
    "nvidia-nccl-cu13",
)


@fact("packages", "installed distributions: name -> version", shape={str: OPT_STR})
def probe_packages(facts) -> dict[str, str | None]:
    return {name: _version(name) for name in PACKAGES}


def module_file(module: str, *parts: str) -> Path | None:
    """Path of a file inside an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location, *parts)
        if candidate.is_file():
            return candidate
    return None


def constants_of(path: Path) -> dict[str, Any]:
    """Module-level `NAME = <literal>` (and annotated) assignments of a Python file."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            with contextlib.suppress(ValueError):
                found[target.id] = ast.literal_eval(value)
    return found


@fact(
    "torch_build",
    "torch's version and the CUDA/HIP it was built for",
    why_missing="torch is not installed",
    shape={"version": OPT_VERSION, "cuda": OPT_VERSION, "hip": OPT_VERSION, "git_version": OPT_STR},
)
def probe_torch_build(facts) -> dict[str, Any] | None:
    """torch's build flavour from torch/version.py (written at build time): CUDA, HIP or CPU."""
    path = module_file("torch", "version.py")
    if path is None:
        return None
    consts = constants_of(path)
    return {
        "version": consts.get("__version__"),
        "cuda": consts.get("cuda"),
        "hip": consts.get("hip"),
        "git_version": consts.get("git_version"),
    }


@fact(
    "deepspeed_defaults",
    "the installed DeepSpeed's version and its defaults the checks compare with",
    why_missing="deepspeed is not installed",
    shape={"version": OPT_VERSION, "gradient_clipping": (float, None), "installed_ops": {str: bool}},
)
def probe_deepspeed_defaults(facts) -> dict[str, Any] | None:
    """Defaults of the installed DeepSpeed that change what an omitted config key means."""
    path = module_file("deepspeed", "runtime", "constants.py")
    if path is None:
        return None
    consts = constants_of(path)
    return {
        "version": _version("deepspeed"),
        # 0. (no clipping) until DeepSpeed PR #8068 (2026), 1.0 since.
        "gradient_clipping": consts.get("GRADIENT_CLIPPING_DEFAULT"),
        "installed_ops": installed_ops(module_file("deepspeed", "git_version_info_installed.py")),
    }


def installed_ops(path) -> dict[str, bool]:
    """The ops built at install time (DS_BUILD_OPS=1 ...): setup.py writes them into git_version_info_installed.py as
    `installed_ops={...}` (what `ds_report` prints as "installed"); read without importing deepspeed."""
    if path is None:
        return {}
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "installed_ops" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(k): bool(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {}


_FLASH_IMPORT = "import torch, flash_attn; from flash_attn import flash_attn_func; print(flash_attn.__version__)"
# bitsandbytes 0.4x-0.50 loads its CUDA library on import and says which one failed on stderr.
_BNB_IMPORT = "import torch, bitsandbytes; from bitsandbytes.nn import Linear4bit; print(bitsandbytes.__version__)"


@fact(
    "flash_attn",
    "flash-attn: installed, importable, its wheel",
    shape={
        "installed": OPT_BOOL,
        "version": OPT_STR,
        "import_ok": OPT_BOOL,
        "import_error": OPT_STR,
        "wheel": OPT_STR,
    },
)
def probe_flash_attn(facts) -> dict[str, Any]:
    """Whether flash-attn imports against this torch. Runs in a child process: importing it
    loads torch and CUDA, and an ABI mismatch only shows as an ImportError there. With the wheel's URL
    when pip recorded one: its name says the torch it was built for (`+cu12torch2.6cxx11abiFALSE`)."""
    found = _imports("flash-attn", _FLASH_IMPORT)
    if found["installed"] and (url := direct_url("flash-attn")):
        found["wheel"] = url
    return found


@fact("bitsandbytes", "bitsandbytes: installed, importable, its CUDA library")
def probe_bitsandbytes(facts) -> dict[str, Any]:
    """Whether bitsandbytes (QLoRA's 4- and 8-bit layers) imports against this torch, in a child process."""
    return _imports("bitsandbytes", _BNB_IMPORT)


def _imports(package: str, code: str) -> dict[str, Any]:
    version = _version(package)
    if version is None:
        return {"installed": False}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {
            "installed": True,
            "version": version,
            "import_ok": False,
            "import_error": "import timed out after 120 s",
        }
    error_lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return {
        "installed": True,
        "version": version,
        "import_ok": proc.returncode == 0,
        "import_error": error_lines[-1] if proc.returncode and error_lines else None,
    }
