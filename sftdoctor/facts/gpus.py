"""NVIDIA GPUs and driver: NVML first (nvidia-ml-py), `nvidia-smi` as the fallback.

The fact looks like:
{"source": "nvml", "driver_version": "535.104.05", "cuda_version": "12.2",
 "devices": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0",
              "memory_total_mib": 81920, "nvlink_links_up": 12, "pci_bus_id": "...", "uuid": "..."}]}
With no GPU or no driver it is {"source": None, "devices": [], "error": "..."}.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Any

from sftdoctor.facts.catalogue import fact
from sftdoctor.facts.shapes import OPT_COUNT, OPT_INT, OPT_STR, OPT_VERSION


def _no_kernel_driver() -> str | None:
    """On Linux (not WSL) a loaded NVIDIA driver exposes /proc/driver/nvidia; without it NVML and
    nvidia-smi cannot work, so say so and skip loading NVML at all."""
    if sys.platform != "linux" or "microsoft" in platform.release().lower():
        return None
    if os.path.exists("/proc/driver/nvidia/version"):
        return None
    return "no NVIDIA kernel driver loaded (/proc/driver/nvidia/version is absent)"


@fact(
    "gpus",
    "the driver, its CUDA, and each GPU (NVML or nvidia-smi)",
    shape={
        "driver_version": OPT_VERSION,
        "cuda_version": OPT_VERSION,
        "devices": [
            {
                "index": OPT_INT,
                "name": OPT_STR,
                "uuid": OPT_STR,
                "pci_bus_id": OPT_STR,
                "compute_capability": OPT_VERSION,
                "memory_total_mib": OPT_COUNT,
                "nvlink_links_up": OPT_COUNT,
            }
        ],
    },
)
def probe_gpus(facts) -> dict[str, Any]:
    reason = _no_kernel_driver()
    if reason:
        return {"source": None, "driver_version": None, "cuda_version": None, "devices": [], "error": reason}
    try:
        return _from_nvml()
    except Exception as exc:  # NVMLError, missing libnvidia-ml, pynvml absent: all mean "ask nvidia-smi"
        nvml_error = f"NVML: {exc}" if str(exc) else f"NVML: {type(exc).__name__}"
    smi = _from_nvidia_smi()
    if smi is not None:
        smi["nvml_error"] = nvml_error
        return smi
    return {"source": None, "driver_version": None, "cuda_version": None, "devices": [], "error": nvml_error}


def cuda_version_from_int(value: int) -> str:
    """NVML/CUDA encode versions as 1000*major + 10*minor (12040 -> "12.4")."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _from_nvml() -> dict[str, Any]:
    import pynvml  # nvidia-ml-py: ctypes bindings, cheap to import

    pynvml.nvmlInit()
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices.append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                    "compute_capability": f"{major}.{minor}",
                    "memory_total_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                    "nvlink_links_up": _nvlinks_up(pynvml, handle),
                }
            )
        return {
            "source": "nvml",
            "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_version": cuda_version_from_int(pynvml.nvmlSystemGetCudaDriverVersion()),
            "devices": devices,
        }
    finally:
        pynvml.nvmlShutdown()


def _nvlinks_up(pynvml, handle) -> int | None:
    up, supported = 0, False
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            continue  # link not present on this board, or NVLink not supported at all
        supported = True
        up += state == pynvml.NVML_FEATURE_ENABLED
    return up if supported else None


_QUERY = "index,name,uuid,pci.bus_id,memory.total,compute_cap,driver_version"


def _run(args: list[str]) -> str | None:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _from_nvidia_smi() -> dict[str, Any] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    table = _run(["nvidia-smi"])
    if table is None:
        return None
    facts = parse_nvidia_smi(table)
    csv = _run(["nvidia-smi", f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits"])
    if csv is not None:  # drivers before ~510 reject compute_cap: keep the table's view then
        facts["devices"] = parse_query_csv(csv)
    links = parse_nvlink_status(_run(["nvidia-smi", "nvlink", "--status"]) or "")
    for device in facts["devices"]:
        device["nvlink_links_up"] = links.get(device["index"]) if links else None
    facts["source"] = "nvidia-smi"
    return facts


def parse_query_csv(text: str) -> list[dict[str, Any]]:
    devices = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 7 or not cells[0].isdecimal():
            continue
        index, name, uuid, bus, memory, cc, _driver = cells
        devices.append(
            {
                "index": int(index),
                "name": name,
                "uuid": uuid,
                "pci_bus_id": bus,
                "compute_capability": cc if re.fullmatch(r"\d+\.\d+", cc) else compute_capability_from_name(name),
                "memory_total_mib": int(memory) if memory.isdecimal() else None,
                "nvlink_links_up": None,
            }
        )
    return devices


_HEADER = re.compile(r"Driver Version:\s*(?P<driver>[\d.]+)(?:.*?CUDA Version:\s*(?P<cuda>[\d.]+|N/A))?")
# "|   0  NVIDIA A100-SXM4-80GB          On  | 00000000:07:00.0 Off |" (persistence or WDDM/TCC column optional)
_GPU_ROW = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s*(?:\b(?:On|Off|WDDM|TCC)\s*)?\|\s*(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)"
)
_MEMORY = re.compile(r"(?P<used>\d+)\s*MiB\s*/\s*(?P<total>\d+)\s*MiB")


def parse_nvidia_smi(text: str) -> dict[str, Any]:
    """Parse the default `nvidia-smi` table (or `nvidia-smi -q` text): driver, CUDA version, and
    per GPU name and memory. Compute capability is not printed there; it is looked up by name."""
    if _QUERY_DRIVER.search(text):
        return _parse_query_text(text)
    header = _HEADER.search(text)
    devices: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    for line in text.splitlines():
        row = _GPU_ROW.match(line.strip())
        if row:
            name = row["name"].strip()
            pending = {
                "index": int(row["index"]),
                "name": name,
                "pci_bus_id": row["bus"],
                "compute_capability": compute_capability_from_name(name),
                "memory_total_mib": None,
                "nvlink_links_up": None,
            }
            devices.append(pending)
            continue
        memory = _MEMORY.search(line)
        if pending is not None and memory:
            pending["memory_total_mib"] = int(memory["total"])
            pending = None
    cuda = header["cuda"] if header and header["cuda"] not in (None, "N/A") else None
    return {
        "source": "nvidia-smi",
        "driver_version": header["driver"] if header else None,
        "cuda_version": cuda,
        "devices": devices,
    }


_QUERY_DRIVER = re.compile(r"^Driver Version\s+:\s*([\d.]+)", re.M)
_QUERY_CUDA = re.compile(r"^CUDA Version\s+:\s*([\d.]+)", re.M)
_QUERY_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", re.M)


def _parse_query_text(text: str) -> dict[str, Any]:
    """`nvidia-smi -q`: a "GPU <bus id>" block per GPU with "Product Name" and "FB Memory Usage/Total"."""
    cuda = _QUERY_CUDA.search(text)
    starts = list(_QUERY_GPU.finditer(text))
    devices = []
    for index, start in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
        block = text[start.end() : end]
        name = re.search(r"Product Name\s+:\s*(.+)", block)
        memory = re.search(r"FB Memory Usage\s*\n\s*Total\s+:\s*(\d+)\s*MiB", block)
        uuid = re.search(r"GPU UUID\s+:\s*(\S+)", block)
        name_text = name[1].strip() if name else "unknown GPU"
        devices.append(
            {
                "index": index,
                "name": name_text,
                "uuid": uuid[1] if uuid else None,
                "pci_bus_id": start[1],
                "compute_capability": compute_capability_from_name(name_text),
                "memory_total_mib": int(memory[1]) if memory else None,
                "nvlink_links_up": None,
            }
        )
    return {
        "source": "nvidia-smi -q",
        "driver_version": _QUERY_DRIVER.search(text)[1],
        "cuda_version": cuda[1] if cuda else None,
        "devices": devices,
    }


_NVLINK_GPU = re.compile(r"^GPU (\d+):")
_NVLINK_LINK = re.compile(r"^\s+Link \d+:\s*(.+)$")


def parse_nvlink_status(text: str) -> dict[int, int]:
    """`nvidia-smi nvlink --status`: active links per GPU index ("Link 3: 26.562 GB/s" is up,
    "Link 3: <inactive>" is not)."""
    counts: dict[int, int] = {}
    current = None
    for line in text.splitlines():
        gpu = _NVLINK_GPU.match(line)
        if gpu:
            current = int(gpu[1])
            counts[current] = 0
            continue
        link = _NVLINK_LINK.match(line)
        if link and current is not None and "inactive" not in link[1].lower():
            counts[current] += 1
    return counts


# Compute capability by marketing name, for nvidia-smi output that lacks it
# (https://developer.nvidia.com/cuda-gpus). Order matters: longer, more specific names first.
_CC_BY_NAME = (
    (r"GB200|B200|B100", "10.0"),
    (r"GB300|B300", "10.3"),
    (r"RTX 50\d\d|RTX PRO \d000", "12.0"),
    (r"GH200|H200|H100|H800|H20\b", "9.0"),
    (r"L40S?|L4\b|L20\b|RTX 40\d\d|RTX \d000 Ada|Ada Generation", "8.9"),
    (r"A100|A800|A30\b", "8.0"),
    (r"A10G?\b|A40\b|A16\b|A2\b|RTX 30\d\d|RTX A\d000|A\d000\b", "8.6"),
    (r"T4\b|RTX 20\d\d|TITAN RTX|Quadro RTX|GTX 16\d\d", "7.5"),
    (r"V100|TITAN V\b", "7.0"),
    (r"P100", "6.0"),
    (r"P40|P4\b|GTX 10\d\d|TITAN Xp", "6.1"),
    (r"K80", "3.7"),
)


def compute_capability_from_name(name: str) -> str | None:
    for pattern, cc in _CC_BY_NAME:
        if re.search(pattern, name):
            return cc
    return None
