"""`sftdoctor chat` as a user runs it, on models taught here in seconds (tests/chat/conftest.py): the answer, and
after it whether the model ended its turn or ran to max_new_tokens, with tokens/s; --json lines for scripts;
--base beside it; a conversation on a real terminal (a pty); bad input refused in one line before any model loads."""

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

import pytest
from cli_contract import sftdoctor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SPEED = re.compile(r"(\d+) tokens, (\d+\.\d) tokens/s")


def chat(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor", "chat", *map(str, args)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def hub_cache(root, model_id: str, folder) -> dict:
    """A Hugging Face cache holding `folder` as `model_id` (a snapshot and refs/main, as hf download leaves
    them), and the environment of a machine offline that uses it."""
    repo = root / ("models--" + model_id.replace("/", "--"))
    shutil.copytree(folder, repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    return {**os.environ, "HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_one_answer_then_its_stop_reason_and_speed_beside_a_base_that_never_stops(chat_models, tmp_path):
    """The base is a hub id, loaded offline from the local cache."""
    env = hub_cache(tmp_path / "hub", "local/untaught", chat_models / "untaught")
    proc = chat(chat_models / "taught", "--prompt", "sort: lime rock pear", "--base", "local/untaught", env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "sftdoctor: base: local/untaught (hub)" in out
    snapshot = tmp_path / "hub" / "models--local--untaught" / "snapshots" / "0123abc"
    assert f"generation settings from {snapshot / 'generation_config.json'}" in out
    model, base = out.split("[model] ")[1].split("[base] ")
    assert model.startswith("lime pear rock\n")  # the row it was taught, and then it stopped
    assert "✓ ended its turn at <|im_end|>: 4 tokens" in model
    # taught the same answers with <|im_end|> masked out of the targets, it never emits it
    assert "! ran to max_new_tokens (256) without <|im_end|>: 256 tokens" in base
    assert "sftdoctor explain training-targets" in base
    assert all(float(speed) > 0 for _, speed in SPEED.findall(out)) and len(SPEED.findall(out)) == 2
    assert "generation settings from " + str(chat_models / "taught" / "generation_config.json") in out
    assert "stops at <|im_end|> (eos_token_id [2])" in out


@pytest.mark.slow
def test_json_lines_for_scripts_with_an_adapter_and_the_generation_config_saved_beside_it(chat_models, tmp_path):
    """The adapter's generation_config.json (eos [0, 2], as sftdoctor writes it) is the one used, not its base's
    (eos 0, which leaves out <|im_end|>: said before the answers, and the base runs to max_new_tokens)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "reverse: fig fish leaf"})
        + "\n\n"
        + json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]})
        + "\n"
    )
    argv = ["chat", chat_models / "adapter", "--prompts", prompts, "--base", chat_models / "eos0", "--json"]
    proc = sftdoctor(argv, tmp_path, [])
    assert proc.exit_code == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["line"], r["role"]) for r in records] == [(1, "model"), (1, "base"), (3, "model"), (3, "base")]
    first = records[0]
    assert first["prompt"] == "reverse: fig fish leaf" and first["answer"] == "leaf fish fig"
    assert (first["stop"], first["stop_token"], first["new_tokens"]) == ("end_of_turn", "<|im_end|>", 4)
    assert first["tokens_per_second"] > 0 and first["model"] == str(chat_models / "adapter")
    assert first["generation"]["eos_token_id"] == [0, 2] and first["generation"]["do_sample"] is False
    assert {r["stop"] for r in records if r["role"] == "base"} == {"max_new_tokens"}
    assert records[1]["end_of_turn_at"] == 3  # the same weights end the turn; eos_token_id 0 does not stop there
    assert records[3]["messages"][0] == {"role": "system", "content": "be brief"}
    assert "eos_token_id [0] (<|endoftext|>) leaves out <|im_end|>" in proc.stderr  # the base's, said once
    assert proc.stderr.count("leaves out") == 1


@pytest.mark.slow
def test_a_tiny_max_new_tokens_cuts_an_answer_that_would_have_ended(chat_models, tmp_path):
    argv = ["chat", chat_models / "taught", "--prompt", "sort: lime rock pear", "--max-new-tokens", 2, "--json"]
    proc = sftdoctor(argv, tmp_path, [])
    record = json.loads(proc.stdout)
    assert (record["stop"], record["new_tokens"], record["answer"]) == ("max_new_tokens", 2, "lime pear")


@pytest.mark.slow
def test_a_conversation_the_chat_template_refuses_is_named_by_its_line_before_any_answer(chat_models, tmp_path):
    folder = tmp_path / "no-system"
    shutil.copytree(chat_models / "taught", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        + config["chat_template"]
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    prompts = tmp_path / "p.jsonl"
    lines = [{"prompt": "hello"}, {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = sftdoctor(["chat", folder, "--prompts", prompts, "--json"], tmp_path, [prompts])
    assert result.exit_code == 2 and result.stdout == ""  # refused before line 1 was answered
    assert result.stderr.startswith(f"sftdoctor: error: {prompts}: line 2: model {folder}: its chat template refuses")
    assert "System role not supported" in result.stderr


def read_until(fd, text: str, timeout: float = 120.0) -> str:
    """What the terminal shows from now until `text` appears (AssertionError if it does not in time); what came
    after it in the same read is dropped, so wait for the last thing expected."""
    seen, deadline = b"", time.monotonic() + timeout
    while text.encode() not in seen:
        assert time.monotonic() < deadline, f"waited for {text!r}; the terminal showed:\n{seen.decode()[-2000:]}"
        if select.select([fd], [], [], 0.2)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the other side closed
                break
    return seen.decode(errors="replace")


def read_some(fd, size: int, timeout: float = 120.0) -> str:
    """At least `size` bytes of what the terminal shows next."""
    seen, deadline = b"", time.monotonic() + timeout
    while len(seen) < size:
        assert time.monotonic() < deadline, f"waited for {size} bytes; the terminal showed:\n{seen.decode()}"
        if select.select([fd], [], [], 0.2)[0]:
            seen += os.read(fd, 4096)
    return seen.decode(errors="replace")


@pytest.mark.slow
def test_a_conversation_on_a_terminal_streams_and_ctrl_c_stops_the_answer_not_the_chat(chat_models):
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: sftdoctor on the terminal
        os.execv(
            sys.executable,
            [sys.executable, "-m", "sftdoctor", "chat", str(chat_models / "taught"), "--base"]
            + [str(chat_models / "untaught"), "--max-new-tokens", "1000000"],
        )
    done = 0
    try:
        read_until(fd, "you> ")
        os.write(fd, b"sort: lime rock pear\r")
        shown = read_until(fd, "[base] ")
        assert "[model] lime pear rock" in shown and "✓ ended its turn at <|im_end|>: 4 tokens" in shown
        streamed = read_some(fd, 60)  # the base's words arrive while it is still generating
        assert streamed.strip() and "ran to max_new_tokens" not in streamed
        os.write(fd, b"\x03")  # Ctrl-C, as the terminal sends it
        assert "~ interrupted (Ctrl-C) after" in read_until(fd, "you> ")
        os.write(fd, b"/reset\r")
        assert "the conversation is forgotten" in read_until(fd, "you> ")  # the prompt is back: Ctrl-D reaches it
        os.write(fd, b"\x04")  # Ctrl-D leaves
        read_until(fd, "\n", 30)
        for _ in range(300):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        assert done and os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(fd)
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


@pytest.mark.parametrize(
    "line, says",
    [
        ("{", "line 2: not valid JSON"),
        ("[1]", "line 2: a JSON list; expected one JSON object a line"),
        ('{"question": "hi"}', "line 2: neither of prompt and messages"),
        ('{"prompt": "a", "messages": []}', "line 2: both of prompt and messages"),
        ('{"prompt": 3}', "line 2: prompt is a JSON int; expected a string"),
        ('{"prompt": "\\ud800"}', "line 2: prompt holds '\\ud800', half of a surrogate pair"),
        ('{"messages": []}', "line 2: messages: expected a non-empty list of turns"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "line 2: messages: turn 0: role is 'robot'"),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
            "line 2: messages end with an assistant turn",
        ),
    ],
)
def test_a_bad_prompts_line_is_named_before_any_model_loads(tmp_path, line, says):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fine"}\n' + line + "\n")
    result = sftdoctor(["chat", tmp_path / "no-model", "--prompts", prompts], tmp_path, [prompts])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"sftdoctor: error: {prompts}: {says}")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "args, says",
    [
        (["{tmp}", "--prompt", "hi"], "TARGET: a folder with neither config.json (a model) nor adapter_config.json"),
        (["{tmp}/nothing", "--prompt", "hi"], "no such model folder, run directory or cached hub id"),
        (["nobody/uncached-model", "--prompt", "hi"], "nobody/uncached-model: TARGET: not a folder here and not in"),
        (
            ["{tmp}", "--prompt", "a", "--prompts", "{tmp}/p.jsonl"],
            "give --prompt TEXT or --prompts FILE.jsonl, not both",
        ),
        (["{tmp}", "--json"], "--json: goes with --prompt TEXT or --prompts FILE.jsonl"),
        (["{tmp}/nothing"], "stdin is not a terminal, so there is no one to talk to"),
        (["", "--prompt", "hi"], "TARGET: an empty name (an unset shell variable?)"),
        (["{tmp}", "--base", " ", "--prompt", "hi"], "--base: an empty name"),
        (["{tmp}", "--prompts", "{tmp}/empty.jsonl"], "empty.jsonl: --prompts: no prompts in it"),
    ],
)
def test_what_cannot_be_talked_to_is_one_line_and_exit_2(tmp_path, monkeypatch, args, says):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    argv = ["chat", *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    result = sftdoctor(
        argv, tmp_path, [tmp_path, "--prompt", "--json", "--base", "TARGET", "chat", "nobody/uncached-model"]
    )
    assert result.exit_code == 2 and says in result.stderr and len(result.stderr.splitlines()) == 1


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner),
    max_leaves=6,
)
LINES = st.one_of(
    st.fixed_dictionaries({"prompt": JSON}),
    st.fixed_dictionaries({"messages": st.lists(JSON, max_size=3)}),
    st.fixed_dictionaries(
        {
            "messages": st.lists(
                st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "x"]), "content": JSON}),
                max_size=3,
            )
        }
    ),
    JSON,
).map(json.dumps) | st.text(max_size=20).filter(lambda s: "\n" not in s and "\r" not in s)


@given(
    lines=st.lists(LINES, max_size=4),
    flags=st.lists(st.sampled_from(["--json", "--base", "--max-new-tokens", "--temperature"]), unique=True),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_prompts_file_and_options_are_a_refusal_of_one_line_naming_the_file_or_option(
    tmp_path_factory, lines, flags
):
    """A prompts file of any lines, and any mix of the options: one line (the first bad line, or the target that
    is no model), exit 2, nothing left behind or running; never a traceback."""
    root = tmp_path_factory.mktemp("fuzz")
    prompts = root / "p.jsonl"
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    values = {"--base": [str(root)], "--max-new-tokens": ["3"], "--temperature": ["0.5"], "--json": []}
    argv = ["chat", str(root / "not-a-model"), "--prompts", str(prompts)] + [v for f in flags for v in [f, *values[f]]]
    result = sftdoctor(argv, root, [prompts, root / "not-a-model"])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
