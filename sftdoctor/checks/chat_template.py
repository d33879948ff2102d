"""chat-template: chat rows need a chat template to be rendered with; a base model's tokenizer has none
(facts/tokenizer.py reads it from the tokenizer's files; facts/data.py the rows' format)."""

from __future__ import annotations

from typing import Any

from sftdoctor.checks import NotApplicable, check
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.run.gpus import version_tuple

NO_DEFAULT = (4, 43)  # transformers removed the class-level default templates (PR #31733)


def chat_rows(train: dict[str, Any]) -> int:
    """Rows TRL renders with the chat template: chat formats (mapped to messages), conversational prompt-completion."""
    return train["rows"] if train["shape"] == "messages" else train.get("conversational_rows", 0)


def what_happens(packages: dict[str, Any]) -> str:
    """What the installed stack does with chat rows and no template (TRL 1.16 sft_trainer.py, transformers 5.25
    tokenization_utils_base.py get_chat_template)."""
    transformers, trl = packages.get("transformers"), packages.get("trl")
    stack = f"TRL {trl}'s" if trl else "TRL's"
    said = (
        f"{stack} SFTTrainer renders each conversation with tokenizer.apply_chat_template and adds no template "
        "of its own (only SFTConfig.chat_template_path would; sftdoctor does not set it). "
    )
    version = version_tuple(transformers)
    if version is not None and version < NO_DEFAULT:
        return said + (
            f"transformers {transformers} falls back to the tokenizer class's default template with a "
            "warning: the model trains on a format it was never meant to be prompted with."
        )
    return said + (
        f"transformers {transformers or '>= 4.43'} raises `ValueError: Cannot use chat template functions "
        "because tokenizer.chat_template is not set` while the trainer is built, after the model has "
        "loaded, on every rank."
    )


@check(
    "chat-template",
    "chat rows have a chat template to be rendered with (a base model's tokenizer has none)",
    messages={
        "not-judged": "chat rows, and no tokenizer files here to read the chat template from",
        "no-template": "chat rows and a tokenizer with no chat template",
    },
)
def chat_template(
    data: dict[str, Any], chat_template: dict[str, Any] | None = None, packages: dict[str, Any] | None = None
):
    train = data["train"]
    chats = chat_rows(train)
    if not chats:
        raise NotApplicable(f"the rows are {train['format']}: TRL tokenizes them as text, no chat template applies")
    if chat_template is None:  # chat rows, and no tokenizer files here to read: said, never passed
        return info(
            f"not judged: {chats:,} of the {train['rows']:,} rows are chat ({train['format']}), and the "
            "tokenizer's files are not here to read its chat template",
            fix="run `sftdoctor check --config RUN.toml` where the model's tokenizer files are (or cached)",
            id="chat-template/not-judged",
        )
    where = chat_template.get("given") or chat_template["folder"]
    if chat_template["has_template"]:
        return ok(f"the {chats:,} chat rows are rendered with the chat template of {where}", evidence=chat_template)
    old = version_tuple((packages or {}).get("transformers"))
    falls_back = bool(old and old < NO_DEFAULT)  # trains, on the class default's format: a warning, not a crash
    return (warning if falls_back else error)(
        f"the tokenizer ({where}) has no chat template, and {chats:,} of the {train['rows']:,} rows are chat "
        f"({train['format']})",
        detail=what_happens(packages or {}) + " A base model's tokenizer has none; its instruct release has one.",
        fix="[model] chat_template = a .jinja file (the instruct release's chat_template.jinja, so the model learns "
        "the format it will be prompted with; sftdoctor/facts/chat_templates/ has ChatML and Zephyr), or [model] "
        "tokenizer = the instruct release's tokenizer, or give the rows as text",
        evidence={
            **chat_template,
            "chat_rows": chats,
            "format": train["format"],
            "transformers": (packages or {}).get("transformers"),
            "falls_back": falls_back,
        },
        id="chat-template/no-template",
    )
