"""The run's chat template, read from the tokenizer's files without importing transformers.

transformers saves it as `chat_template.jinja` (4.43+) or inside tokenizer_config.json (a string, or a
list of named variants whose "default" is the one used). Loss on assistant turns only
(TRL `assistant_only_loss`) needs `{% generation %}` markers: present in the template, or patched in by
TRL, which (1.16, chat_template_utils.get_training_chat_template) does it for the templates it bundles
under trl/chat_templates/NAME.jinja that have a NAME_training.jinja, matched by exact text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sftdoctor.facts.configs import hub_cache_config
from sftdoctor.facts.packages import module_file

# TRL 1.16 has_generation_markers(): whitespace-trim variants included.
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def tokenizer_folder(name: str) -> Path | None:
    local = Path(name)
    if local.is_dir():
        return local
    cached = hub_cache_config(name)
    return cached.parent if cached else None


def read_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8", errors="replace")
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named variants
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def trl_patchable(template: str) -> bool:
    init = module_file("trl", "chat_template_utils.py")
    if init is None:
        return False
    folder = init.parent / "chat_templates"
    for bundled in folder.glob("*.jinja"):
        if bundled.stem.endswith("_training"):
            continue
        training = folder / f"{bundled.stem}_training.jinja"
        if training.is_file() and bundled.read_text(encoding="utf-8") == template:
            return True
    return False


def probe_chat_template(facts) -> dict[str, Any] | None:
    run = facts.get("run")
    if run is None:
        return None
    folder = tokenizer_folder(run.model.tokenizer or run.model.path)
    if folder is None:
        return None
    template = read_template(folder)
    if template is None:
        return {"folder": str(folder), "has_template": False, "generation_markers": False, "trl_patchable": False}
    return {"folder": str(folder), "has_template": True, "generation_markers": bool(GENERATION.search(template)),
            "trl_patchable": trl_patchable(template)}
