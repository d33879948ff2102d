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
from datetime import datetime
from pathlib import Path
from typing import Any

from sftdoctor.facts.catalogue import RUN_CONFIG, fact
from sftdoctor.facts.configs import hub_cache_config
from sftdoctor.facts.packages import module_file
from sftdoctor.facts.probe_cache import cached

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


BUNDLED = Path(__file__).parent / "chat_templates"
# Conversations a drop-in template must render exactly as the tokenizer's own: the turns SFT rows have,
# a system turn, several turns, and the generation prompt inference adds.
_Q, _A = "What is 2 + 2?\nShow your work.", "2 + 2 = 4.\n\nSo: 4"
CONVERSATIONS = (
    ([{"role": "user", "content": _Q}, {"role": "assistant", "content": _A}], False),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": _Q},
            {"role": "assistant", "content": _A},
        ],
        False,
    ),
    (
        [
            {"role": "user", "content": _Q},
            {"role": "assistant", "content": _A},
            {"role": "user", "content": "And 3 + 3?"},
            {"role": "assistant", "content": "6"},
        ],
        False,
    ),
    ([{"role": "user", "content": _Q}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": _Q}], True),
)


def special_tokens(folder: Path) -> dict[str, str]:
    """bos_token, eos_token, ... as a template sees them (transformers passes the special tokens map)."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            config = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
            value = config.get(key) if isinstance(config, dict) else None
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                found.setdefault(key, value)
    return found


def render(template: str, tokens: dict[str, str], messages: list[dict[str, str]], prompt: bool) -> str | None:
    """The template's text for these messages, rendered as transformers renders it ({% generation %} is a
    no-op there too); None when the template refuses them (raise_exception) or cannot be compiled."""
    from jinja2 import TemplateError, nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=prompt, tools=None, documents=None, **tokens
        )
    except Exception:  # a template's own error (TemplateError, TypeError on a missing key): it refuses them
        return None


def marked_templates() -> list[tuple[str, str, Path]]:
    """(name, source, path) of the templates with generation markers sftdoctor can train with: its own,
    then TRL's bundled training templates."""
    found = [(p.stem, "sftdoctor", p) for p in sorted(BUNDLED.glob("*.jinja"))]
    init = module_file("trl", "chat_template_utils.py")
    if init is not None:
        found += [(p.stem, "trl", p) for p in sorted((init.parent / "chat_templates").glob("*_training.jinja"))]
    return found


def marked_equivalent(template: str, tokens: dict[str, str]) -> dict[str, str] | None:
    """A template with {% generation %} markers that renders every one of CONVERSATIONS exactly as
    `template` does (and refuses the same ones): training with it changes the loss mask and nothing else."""
    try:
        import jinja2  # noqa: F401  (a light install may lack it: then nothing is offered)
    except ImportError:
        return None
    own = [render(template, tokens, messages, prompt) for messages, prompt in CONVERSATIONS]
    if own[0] is None:
        return None
    for name, source, path in marked_templates():
        text = path.read_text(encoding="utf-8")
        if all(
            render(text, tokens, messages, prompt) == expected
            for (messages, prompt), expected in zip(CONVERSATIONS, own)
        ):
            return {"name": name, "source": source, "path": str(path)}
    return None


@fact(
    "chat_template",
    "the tokenizer's chat template, rendered",
    inputs=RUN_CONFIG,
    why_missing="no run config, or its tokenizer has no files here",
    needs=("run",),
)
def probe_chat_template(facts, run) -> dict[str, Any] | None:
    folder = tokenizer_folder(run.model.tokenizer or run.model.path)
    if folder is None:
        return None
    given = Path(run.model.chat_template) if run.model.chat_template else None
    template = read_template(folder) if given is None else given.read_text(encoding="utf-8", errors="replace")
    if template is None:
        return {"folder": str(folder), "has_template": False, "generation_markers": False, "trl_patchable": False}
    markers, patchable = bool(GENERATION.search(template)), trl_patchable(template)
    found = {"folder": str(folder), "has_template": True, "generation_markers": markers, "trl_patchable": patchable}
    if given:
        found["given"] = str(given)
    elif not markers and not patchable:
        tokens = special_tokens(folder)  # a no-match compiles every candidate (~0.6 s): kept on disk
        found["marked_equivalent"] = cached(
            "drop-in", [template, tokens], [], lambda: {"found": marked_equivalent(template, tokens)}
        )["found"]
    return found
