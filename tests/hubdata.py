"""Hub datasets without the network, for the tests of `[data] train = "org/name"` and of folders laid out as a
dataset repository: a datasets cache that the datasets library itself fills, and the environment that points a
command at it.

Offline, `load_dataset("org/name")` reads only the datasets cache, `$HF_DATASETS_CACHE/org___name/<config>/0.0.0/
<revision>/` (datasets 5.2 load.py CachedDatasetModuleFactory; never the hub's snapshot cache). Its Parquet builder,
given the config as `config_id` and the revision as its hash, writes exactly that layout; it runs in a child
process because datasets reads HF_DATASETS_CACHE once, at import.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"

_SEED = """
import json, os, shutil, sys, tempfile
import datasets
from datasets.packaged_modules.parquet.parquet import Parquet
repo_id, data_files, config, revision = json.loads(sys.argv[1])
org, name = repo_id.split("/")
tmp = tempfile.mkdtemp()
builder = Parquet(cache_dir=tmp, dataset_name=name, config_name=config, config_id=config, hash=revision,
                  data_files=data_files)
builder.download_and_prepare()
shutil.copytree(os.path.join(tmp, name), os.path.join(datasets.config.HF_DATASETS_CACHE, f"{org}___{name}"),
                dirs_exist_ok=True)
shutil.rmtree(tmp)
"""


def hub_env(home: Path, offline: bool = True) -> dict[str, str]:
    """The environment of a command that reads hub datasets from `home` (and, offline, only from there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(home), HF_DATASETS_CACHE=str(home / "datasets"), HF_HUB_CACHE=str(home / "hub"))
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def seed_cache(home: Path, repo_id: str, data_files: dict[str, list[str]], config="default", revision=REVISION):
    """`repo_id` (its name in snake case, as datasets names its cache folders) in the datasets cache under `home`,
    as a download of `revision` would leave it: the Parquet files of each split prepared into Arrow by datasets."""
    subprocess.run(
        [sys.executable, "-c", _SEED, json.dumps([repo_id, data_files, config, revision])],
        env=hub_env(home),
        check=True,
        capture_output=True,
    )


def hub_folder(folder: Path, splits: dict[str, list[dict]], config="default", suffix=".parquet") -> Path:
    """A folder laid out as a dataset repository: a README with `configs`, one shard per split (Parquet or JSON
    Lines)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "data").mkdir(parents=True, exist_ok=True)
    lines = ["---", "configs:", f"- config_name: {config}", "  data_files:"]
    for split, rows in splits.items():
        shard = folder / "data" / f"{split}-00000-of-00001{suffix}"
        if suffix == ".parquet":
            pq.write_table(pa.Table.from_pylist(rows), shard)
        else:
            shard.write_text("".join(json.dumps(r) + "\n" for r in rows))
        lines += [f"  - split: {split}", f"    path: data/{split}-*{suffix}"]
    (folder / "README.md").write_text("\n".join(lines + ["---", ""]))
    return folder
