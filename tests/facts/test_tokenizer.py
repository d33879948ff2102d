"""The chat-template probe (facts/tokenizer.py): where the template is read from, its {% generation %} markers,
whether TRL can patch it, and its verdict against transformers' loading and TRL's own decision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.tokenizer import GENERATION, read_template, trl_patchable

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "examples" / "tiny" / "model"
TINY_TEMPLATE = json.loads((TINY_MODEL / "tokenizer_config.json").read_text())["chat_template"]


def trl_templates() -> Path:
    import trl.chat_template_utils

    return Path(trl.chat_template_utils.__file__).parent / "chat_templates"


def bundled() -> list[Path]:
    """TRL's bundled templates, without their *_training variants."""
    return sorted(p for p in trl_templates().glob("*.jinja") if not p.stem.endswith("_training"))


def tokenizer_files(folder: Path, chat_template=..., jinja: str | None = None) -> Path:
    """The tiny tokenizer's files in `folder`, with this chat_template in tokenizer_config.json (... = none)
    and, if given, a chat_template.jinja."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(TINY_MODEL / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((TINY_MODEL / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    if chat_template is not ...:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (folder / "chat_template.jinja").write_text(jinja, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tiny_tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(TINY_MODEL)


# ---------------------------------------------------------------- read_template


def test_the_template_is_read_from_chat_template_jinja_before_tokenizer_config(tmp_path):
    folder = tokenizer_files(tmp_path, chat_template="FROM CONFIG", jinja="FROM JINJA {{ messages }}\n")
    assert read_template(folder) == "FROM JINJA {{ messages }}\n"


def test_the_template_is_read_from_a_string_in_tokenizer_config(tmp_path):
    assert read_template(tokenizer_files(tmp_path, chat_template="{{ messages }}")) == "{{ messages }}"


def test_of_named_variants_the_default_one_is_read(tmp_path):
    folder = tokenizer_files(
        tmp_path, chat_template=[{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]
    )
    assert read_template(folder) == "DEFAULT"


def test_named_variants_without_a_default_read_as_no_template(tmp_path):
    assert read_template(tokenizer_files(tmp_path, chat_template=[{"name": "tool_use", "template": "TOOLS"}])) is None


def test_no_template_and_no_tokenizer_files_read_as_none(tmp_path):
    assert read_template(tokenizer_files(tmp_path / "plain")) is None
    assert read_template(tmp_path / "empty") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer_config.json").write_text("{not json")
    assert read_template(tmp_path / "broken") is None


@pytest.mark.parametrize("form", ["string", "variants", "jinja", "none"])
def test_the_template_read_is_the_one_transformers_loads(tmp_path, form):
    import transformers

    folder = {
        "string": lambda: tokenizer_files(tmp_path, chat_template="S {{ messages }}"),
        "variants": lambda: tokenizer_files(
            tmp_path,
            chat_template=[{"name": "default", "template": "D {{ messages }}"}, {"name": "rag", "template": "R"}],
        ),
        "jinja": lambda: tokenizer_files(tmp_path, chat_template="C", jinja="J {{ messages }}\n"),
        "none": lambda: tokenizer_files(tmp_path),
    }[form]()
    loaded = transformers.AutoTokenizer.from_pretrained(folder).chat_template
    if isinstance(loaded, dict):
        loaded = loaded["default"]  # the variant apply_chat_template uses without a name
    assert read_template(folder) == loaded


# ---------------------------------------------------------------- markers and TRL patching


@pytest.mark.parametrize(
    "text",
    [
        "{% generation %}",
        "{%- generation -%}",
        "{%- generation %}",
        "{% generation -%}",
        "{%generation%}",
        "{%  generation  %}",
    ],
)
def test_generation_markers_are_found_in_every_whitespace_form(text):
    assert GENERATION.search(f"{{{{ '<a>' }}}}{text}{{{{ m }}}}{{% endgeneration %}}")


@pytest.mark.parametrize("text", ["{% endgeneration %}", "{{ generation }}", "{% if generation %}", "generation"])
def test_other_uses_of_the_word_are_not_markers(text):
    assert not GENERATION.search(text)


def test_the_exact_text_of_a_bundled_template_trl_can_patch_is_patchable():
    folder = trl_templates()
    patchable = [p for p in bundled() if (folder / f"{p.stem}_training.jinja").is_file()]
    assert any(p.stem == "qwen2_5" for p in patchable)
    for path in patchable:
        assert trl_patchable(path.read_text(encoding="utf-8")), path.name


def test_a_modified_copy_of_a_bundled_template_is_not_patchable():
    text = (trl_templates() / "qwen2_5.jinja").read_text(encoding="utf-8")
    assert not trl_patchable(text.replace("You are Qwen", "You are Bob"))
    assert not trl_patchable(text + "\n")


def test_a_bundled_template_without_a_training_variant_is_not_patchable():
    folder = trl_templates()
    lonely = [p for p in bundled() if not (folder / f"{p.stem}_training.jinja").is_file()]
    assert lonely  # llama3_1, gemma4, ... in TRL 1.16
    for path in lonely:
        assert not trl_patchable(path.read_text(encoding="utf-8")), path.name


def test_the_tiny_template_is_not_one_of_trls():
    assert not trl_patchable(TINY_TEMPLATE)


# ---------------------------------------------------------------- the probe


def test_the_probe_on_the_tiny_example(monkeypatch):
    monkeypatch.chdir(ROOT)
    fact = Facts(Inputs(config=Path("examples/tiny.toml"))).get("chat_template")
    assert Path(fact.pop("folder")).resolve() == TINY_MODEL.resolve()
    assert fact == {"has_template": True, "generation_markers": True, "trl_patchable": False}


def run_toml(tmp_path, model: str, tokenizer: str | None = None) -> Path:
    (tmp_path / "train.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    lines = ["[model]", f'path = "{model}"'] + ([f'tokenizer = "{tokenizer}"'] if tokenizer else [])
    lines += ["[data]", 'train = "train.jsonl"']
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_probe_reads_the_separate_tokenizer_folder_when_one_is_given(tmp_path):
    tokenizer_files(tmp_path / "tok", jinja="{{ m }}")
    (tmp_path / "model").mkdir()
    fact = Facts(Inputs(config=run_toml(tmp_path, "model", "tok"))).get("chat_template")
    assert Path(fact["folder"]).resolve() == (tmp_path / "tok").resolve()
    assert fact["has_template"] and not fact["generation_markers"] and not fact["trl_patchable"]


def test_the_probe_says_so_when_the_tokenizer_has_no_template(tmp_path):
    tokenizer_files(tmp_path / "model")
    fact = Facts(Inputs(config=run_toml(tmp_path, "model"))).get("chat_template")
    assert {k: fact[k] for k in ("has_template", "generation_markers", "trl_patchable")} == {
        "has_template": False,
        "generation_markers": False,
        "trl_patchable": False,
    }


def test_a_hub_tokenizer_that_is_not_cached_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    facts = Facts(Inputs(config=run_toml(tmp_path, "nobody/not-a-model")))
    assert facts.get("chat_template") is None
    assert facts.why_missing("chat_template")


def test_the_probe_reads_a_hub_tokenizer_from_the_local_cache(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    tokenizer_files(snapshot, chat_template=(trl_templates() / "qwen2_5.jinja").read_text(encoding="utf-8"))
    (snapshot / "config.json").write_text((TINY_MODEL / "config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    fact = Facts(Inputs(config=run_toml(tmp_path, "org/tiny"))).get("chat_template")
    assert Path(fact["folder"]) == snapshot
    assert fact["has_template"] and not fact["generation_markers"] and fact["trl_patchable"]


# ---------------------------------------------------------------- the verdict against TRL's decision


def trl_trains_assistant_only(tokenizer) -> bool:
    """What TRL 1.16's SFTTrainer does with assistant_only_loss=True: a template with markers is used as it is;
    otherwise get_training_chat_template patches it, or raises ValueError."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if has_generation_markers(tokenizer.chat_template):
        return True
    try:
        return get_training_chat_template(tokenizer) is not None
    except ValueError:
        return False


def probe_verdict(template: str) -> bool:
    return bool(GENERATION.search(template)) or trl_patchable(template)


def test_the_tiny_tokenizer_needs_no_patching_by_trl(tiny_tokenizer):
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    assert tiny_tokenizer.chat_template == read_template(TINY_MODEL)
    assert has_generation_markers(tiny_tokenizer.chat_template) is bool(GENERATION.search(TINY_TEMPLATE)) is True
    assert get_training_chat_template(tiny_tokenizer) is None  # TRL: already training-compatible
    assert trl_trains_assistant_only(tiny_tokenizer) == probe_verdict(TINY_TEMPLATE)


@pytest.mark.parametrize("name", [p.stem for p in bundled()] + ["qwen2_5 modified", "tiny without markers"])
def test_the_probe_agrees_with_trl_on_every_bundled_template(tiny_tokenizer, name):
    if name == "qwen2_5 modified":
        template = (trl_templates() / "qwen2_5.jinja").read_text(encoding="utf-8").replace("Alibaba", "someone")
    elif name == "tiny without markers":
        template = TINY_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    else:
        template = (trl_templates() / f"{name}.jinja").read_text(encoding="utf-8")
    tokenizer = tiny_tokenizer
    saved, tokenizer.chat_template = tokenizer.chat_template, template
    try:
        assert probe_verdict(template) == trl_trains_assistant_only(tokenizer)
    finally:
        tokenizer.chat_template = saved


# ---------------------------------------------------------------- drop-in templates with generation markers

from sftdoctor.facts.tokenizer import CONVERSATIONS, marked_equivalent, marked_templates, render  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "chat_templates"
RECORDED = json.loads((FIXTURES / "index.json").read_text())


def transformers_render(tokenizer, template: str, messages, prompt: bool) -> str | None:
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=prompt
        )
    except (TemplateError, TypeError, KeyError, ValueError):
        return None


@pytest.mark.parametrize("entry", RECORDED, ids=[e["file"] for e in RECORDED])
def test_a_recorded_template_gets_the_drop_in_that_renders_it(entry):
    template = (FIXTURES / entry["file"]).read_text(encoding="utf-8")
    found = marked_equivalent(template, entry["tokens"])
    assert (found and found["name"]) == entry["drop_in"], found
    if found:
        marked = Path(found["path"]).read_text(encoding="utf-8")
        assert GENERATION.search(marked)
        for messages, prompt in CONVERSATIONS:
            assert render(marked, entry["tokens"], messages, prompt) == render(
                template, entry["tokens"], messages, prompt
            )


@pytest.mark.parametrize("path", [p for _, _, p in marked_templates()] + bundled(), ids=lambda p: p.name)
def test_the_comparison_renders_exactly_as_transformers(tiny_tokenizer, path):
    """Every template sftdoctor may compare, rendered by render() and by transformers' apply_chat_template
    (tiny tokenizer's special tokens): the same text, or both refuse the conversation."""
    template = path.read_text(encoding="utf-8")
    tokens = {k: v for k, v in tiny_tokenizer.special_tokens_map.items() if isinstance(v, str)}
    for messages, prompt in CONVERSATIONS:
        assert render(template, tokens, messages, prompt) == transformers_render(
            tiny_tokenizer, template, messages, prompt
        )


def test_a_drop_in_with_the_generation_prompt_trains_only_the_answer(tiny_tokenizer):
    """transformers' own assistant mask over sftdoctor's chatml drop-in: the answer and its <|im_end|>."""
    template = next(p for n, _, p in marked_templates() if n == "chatml").read_text(encoding="utf-8")
    messages = CONVERSATIONS[0][0]
    out = tiny_tokenizer.apply_chat_template(
        messages, chat_template=template, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tiny_tokenizer.decode(trained) == messages[1]["content"] + "<|im_end|>"


def test_a_template_that_refuses_every_conversation_has_no_drop_in():
    assert marked_equivalent("{{ raise_exception('no') }}", {}) is None
    assert marked_equivalent("{% for %}", {}) is None  # does not compile


def test_a_run_config_template_is_the_one_probed(tmp_path):
    tokenizer_files(
        tmp_path / "model",
        chat_template=TINY_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", ""),
    )
    given = tmp_path / "mine.jinja"
    given.write_text(TINY_TEMPLATE)
    path = run_toml(tmp_path, "model")
    plain = Facts(Inputs(config=path)).get("chat_template")
    assert not plain["generation_markers"] and plain["marked_equivalent"]["name"] == "chatml"
    path.write_text(path.read_text().replace("[model]\n", '[model]\nchat_template = "mine.jinja"\n'))
    fact = Facts(Inputs(config=path)).get("chat_template")
    assert fact["generation_markers"] and fact["given"] == str(given.resolve()) and "marked_equivalent" not in fact
