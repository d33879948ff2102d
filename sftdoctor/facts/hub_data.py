"""The run's data source (run/data_source.py) resolved to files, by the datasets library in a child process (so
`check` never imports it): a local folder laid out as a dataset repository to the data files of its subset and
split, as `load_dataset` resolves them (its README's `configs`, else files named by split); an org/name id to the
Arrow files `load_dataset` prepared in the datasets cache (read from that cache when offline: HF_HUB_OFFLINE=1),
with the revision they came from. Everything downstream reads those files.

A folder's files are read as files, never through the folder's own builder: datasets 5.2 reuses a folder's cache
after its files change (the builder hash covers the README, not the files' mtimes) and infers one file format for
every subset from the first. Verified against datasets 5.2.0 and huggingface_hub 2.4.0.

    python -m sftdoctor.facts.hub_data <<< '{"kind": "hub", "name": "org/name", "subset": null, "split": "train", ...}'
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

from sftdoctor.errors import InputError, not_a_file
from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.child import in_child, serve
from sftdoctor.run.data_source import DATA_SUFFIXES, FILES, FOLDER, source

TIMEOUT_S = 3600  # a hub dataset downloaded and prepared into the cache on a first run: bounded, then refused
HUB_TIMEOUT_S = 5.0  # one metadata request when an id is not cached and the hub may be unreachable
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's constants.ENV_VARS_TRUE_VALUES
KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


@fact(
    "data_source",
    "where the training rows come from: data files, or a hub dataset (a local folder or an org/name id) resolved by "
    "the datasets library to its files, subset, split and revision",
    inputs=RUN_CONFIG,
    why_missing="no run config given (--config)",
    needs=("run",),
)
def probe_data_source(facts, run) -> dict[str, Any] | None:
    src = source(run)
    if src.kind == FILES:
        return {"kind": FILES, "train": list(run.data.train), "eval": list(run.data.eval)}
    answer = in_child("sftdoctor.facts.hub_data", src.request(), f"reading {src.name}", TIMEOUT_S)
    if "refused" in answer:
        raise InputError(run.path, answer["refused"], key=answer["key"])
    if "error" in answer:
        raise InputError(run.path, f"{src.name}: {error_words(answer['error'])}", key="[data].train")
    if not answer["eval"]:  # no eval split of its own: the eval files, if any
        answer["eval"] = list(run.data.eval)
    for name in (*answer["train"], *answer["eval"]):
        if why := not_a_file(name):
            raise InputError(run.path, f"{src.describe()}: cannot read {name} ({why})", key="[data].train")
    return answer


def error_words(error: str) -> str:
    """What a failure of the child means to the user: the datasets library missing, else its own words."""
    if "No module named 'datasets'" in error:
        return "a hub dataset is read with the datasets library, which is not installed (pip install datasets)"
    return f"the datasets library could not read it ({error})"


def offline() -> str | None:
    """The variable that keeps datasets offline, as datasets 5.2 reads it (config.py: HF_DATASETS_OFFLINE, else
    huggingface_hub's HF_HUB_OFFLINE)."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if value := os.environ.get(name):
            return f"{name}={value}" if value.upper() in TRUE else None
    return None


# ---------------------------------------------------------------- the child's side


class Refused(Exception):
    """A subset, split or dataset the source does not have: (key, message), said to the user as bad input."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key, self.message = key, message


def resolve(request: dict[str, Any]) -> dict[str, Any]:
    """The files of the requested split (and evaluation split), the subset resolved, the splits available, and
    for an id the revision the cache holds; or {"refused": ..., "key": ...}."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()  # "Using the latest cached version ...": the answer says it
    try:
        return (_folder if request["kind"] == FOLDER else _hub)(request)
    except Refused as exc:
        return {"refused": exc.message, "key": exc.key}
    except Exception as exc:  # noqa: BLE001 - the library's own errors, each worded where it is known
        key, message = _words(exc, request)
        return {"refused": message, "key": key}


def _builder(request: dict[str, Any], **kw: Any):
    from datasets import load_dataset_builder

    return load_dataset_builder(request["name"], request["subset"], **kw)


def _wanted(request: dict[str, Any]) -> list[tuple[str, str]]:
    return [("[data].split", request["split"])] + (
        [("[data].eval_split", request["eval_split"])] if request["eval_split"] else []
    )


def _check_splits(request: dict[str, Any], available: list[str], subset: str) -> None:
    for key, split in _wanted(request):
        if available and split not in available:
            raise Refused(
                key, f"{request['name']} (subset {subset}) has no split {split!r}; available: {', '.join(available)}"
            )


def _folder(request: dict[str, Any]) -> dict[str, Any]:
    builder = _builder(request)
    data_files = builder.config.data_files or {}
    subset = builder.config.name
    _check_splits(request, list(data_files), subset)
    files = {split: [str(f) for f in data_files[split]] for _, split in _wanted(request)}
    for split, names in files.items():
        odd = sorted({Path(n).suffix or Path(n).name for n in names if not n.lower().endswith(DATA_SUFFIXES)})
        if odd:
            raise Refused(
                "[data].train",
                f"{request['name']} (subset {subset}) split {split} is {', '.join(odd)} data; sftdoctor reads JSON "
                "Lines, JSON and Parquet shards",
            )
    readme = Path(request["name"], "README.md")
    return {
        "kind": FOLDER,
        "name": request["name"],
        "subset": subset,
        "split": request["split"],
        "eval_split": request["eval_split"],
        "revision": None,
        "splits": list(data_files),
        "train": files[request["split"]],
        "eval": files.get(request["eval_split"], []),
        "readme": str(readme) if readme.is_file() else None,
    }


def _hub(request: dict[str, Any]) -> dict[str, Any]:
    from datasets import load_dataset

    if not offline() and not _cached(request["name"]):
        _reachable(request)  # else datasets 5.2 retries for ~23 s (huggingface_hub's http_backoff) before it fails
    builder = _builder(request, revision=request["revision"])
    subset = builder.config.name
    if request["revision"] and (said := offline()) and builder.hash != request["revision"]:
        # offline, datasets 5.2 reads the newest cached revision whatever is asked (cache.py _find_hash_in_cache)
        raise Refused(
            "[data].revision",
            f"the local datasets cache holds {request['name']} at revision {builder.hash}, not {request['revision']} "
            f"({said}: datasets would read the cached one): load that revision once where there is network, or "
            "remove revision",
        )
    available = list(builder.config.data_files or {}) or list(builder.info.splits or {})
    _check_splits(request, available, subset)
    files = {}
    for key, split in _wanted(request):
        dataset = load_dataset(request["name"], subset, split=split, revision=request["revision"])
        files[split] = [f["filename"] for f in dataset.cache_files]
        if not files[split]:
            raise Refused(key, f"{request['name']} split {split} was loaded into memory, not into the datasets cache")
    return {
        "kind": "hub",
        "name": request["name"],
        "subset": subset,
        "split": request["split"],
        "eval_split": request["eval_split"],
        "revision": builder.hash,  # the commit the cache holds (datasets names the cache folder by it)
        "splits": available,
        "train": files[request["split"]],
        "eval": files.get(request["eval_split"], []),
        "cache": offline() is not None,
    }


def _cached(name: str) -> bool:
    """Whether the datasets cache holds any prepared config of `name`, where datasets 5.2 looks when the hub cannot
    be reached (load.py CachedDatasetModuleFactory: HF_DATASETS_CACHE/org___snake_case(name)/*/*/*)."""
    from datasets import config

    org, _, base = name.rpartition("/")
    snake = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", base)).lower()
    root = Path(config.HF_DATASETS_CACHE).expanduser() / f"{org}___{snake}"  # utils/py_utils.camelcase_to_snakecase
    return any(p.is_dir() for p in root.glob("*/*/*"))


def _reachable(request: dict[str, Any]) -> None:
    """Refused when the hub cannot give `name` (one bounded metadata request): unreachable, no such dataset or
    revision, gated."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    name = request["name"]
    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).dataset_info(
            name, revision=request["revision"], timeout=HUB_TIMEOUT_S
        )
    except RevisionNotFoundError:
        raise Refused("[data].revision", f"{name} has no revision {request['revision']!r} on the hub") from None
    except GatedRepoError:
        raise Refused("[data].train", f"{name} is gated: accept its terms on huggingface.co and log in") from None
    except RepositoryNotFoundError:
        raise Refused(
            "[data].train", f"the hub has no dataset {name} (or it is private: log in with hf auth login)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any network failure (httpx, OSError) means the same here
        raise Refused(
            "[data].train",
            f"{name} is not in the local datasets cache and the Hugging Face hub cannot be reached "
            f"({type(exc).__name__}: {str(exc)[:120]}): load it once where there is network, or give a local folder",
        ) from None


_LISTED = re.compile(r"(?:Available(?: configs in the cache)?|available configs): (\[.*?\])")


def _listed(text: str) -> str:
    """The names a datasets message lists ("Available: ['a', 'b']"), as "a, b"."""
    match = _LISTED.search(text)
    if match:
        try:
            return ", ".join(map(str, ast.literal_eval(match.group(1))))
        except (ValueError, SyntaxError):
            return match.group(1)
    many = re.search(r"configurations in the cache: ([^\n]*)", text)
    return many.group(1) if many else ""


def _words(exc: Exception, request: dict[str, Any]) -> tuple[str, str]:
    """(key, message) of the datasets library's refusal of the request, in the user's terms."""
    name, text = request["name"], str(exc)
    first = (text.strip().splitlines() or [type(exc).__name__])[0][:300]
    if "BuilderConfig" in text or "find cache for" in text and "config" in text:
        return "[data].subset", f"{name} has no subset {request['subset']!r}; available: {_listed(text)}"
    if "Config name is missing" in text or "multiple" in text and "configurations" in text:
        return "[data].subset", f"{name} has several subsets: name one in [data] subset ({_listed(text)})"
    if "Unknown split" in text or "Bad split" in text:
        return "[data].split", f"{name}: {first}"
    if isinstance(exc, ConnectionError) and (said := offline()):
        call = ", ".join([repr(name)] + ([repr(request["subset"])] if request["subset"] else []))
        return "[data].train", (
            f"{name} is not in the local datasets cache and {said}: load it once where there is network "
            f'(python -c "import datasets; datasets.load_dataset({call})"), or give a local folder laid out as '
            "the dataset repository"
        )
    if isinstance(exc, ConnectionError) or type(exc).__module__.startswith(("httpx", "requests", "urllib3")):
        return "[data].train", (
            f"{name} is not in the local datasets cache and the Hugging Face hub cannot be reached "
            f"({type(exc).__name__}: {first}): load it once where there is network, or give a local folder"
        )
    return "[data].train", f"{name}: the datasets library could not read it ({type(exc).__name__}: {first})"


if __name__ == "__main__":
    serve(resolve)
