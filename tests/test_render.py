"""sftdoctor.render: the summary line, the exit code, the table people read and the JSON document machines read."""

import dataclasses
import io
import json
from pathlib import Path

import pytest

from sftdoctor import __version__
from sftdoctor.checks import Skipped
from sftdoctor.findings import error, info, ok, warning
from sftdoctor.render import exit_code, render_json, render_table, summary, summary_line


class Terminal(io.StringIO):
    """Text written to what says it is a terminal."""

    def isatty(self):
        return True


FINDINGS = [
    error(
        "bf16 is requested but 4x Tesla V100 lack bf16",
        "bf16 needs compute capability 8.0",
        'use fp16: [model].precision = "fp16"',
        id="bf16-support",
        explain="bf16-support",
    ),
    warning(
        "gradient_clipping is 0",
        "DeepSpeed stops clipping",
        "set gradient_clipping = auto",
        id="deepspeed-precision",
        explain="deepspeed-clipping",
    ),
    info("2 NCCL variables set", "NCCL_DEBUG=INFO", "unset NCCL_DEBUG for speed", id="nccl-env", explain="nccl-env"),
    ok("llama saved in bfloat16, trained in bf16", "torch_dtype=bfloat16", id="model-dtype", explain="model-dtype"),
]
SKIPPED = [Skipped("gpu-topology", "no `nvidia-smi topo -m` matrix (give one with --topology)")]


def table(findings=FINDINGS, skipped=SKIPPED, **kw) -> str:
    out = io.StringIO()
    render_table(findings, skipped, out=out, **kw)
    return out.getvalue()


def test_summary_counts_each_severity_and_the_skipped():
    assert summary(FINDINGS + [FINDINGS[0]], SKIPPED) == {
        "ok": 1,
        "info": 1,
        "warning": 1,
        "error": 2,
        "skipped": 1,
        "silenced": 0,
    }
    assert summary([], []) == {"ok": 0, "info": 0, "warning": 0, "error": 0, "skipped": 0, "silenced": 0}


@pytest.mark.parametrize(
    "findings, skipped, line",
    [
        (FINDINGS, SKIPPED, "5 checks: 1 error, 1 warning, 1 info, 1 ok, 1 skipped"),
        (
            [error("a", id="a"), error("b", id="b"), warning("c", id="c"), warning("d", id="d")],
            [],
            "4 checks: 2 errors, 2 warnings, 0 info, 0 ok, 0 skipped",
        ),
        (
            [info("a", id="a"), info("b", id="b"), ok("c", id="c"), ok("d", id="d")],
            SKIPPED * 2,
            "6 checks: 0 errors, 0 warnings, 2 info, 2 ok, 2 skipped",
        ),
        ([], [], "0 checks: 0 errors, 0 warnings, 0 info, 0 ok, 0 skipped"),
    ],
)
def test_summary_line_says_error_and_warning_in_the_singular_only_for_one(findings, skipped, line):
    assert summary_line(findings, skipped) == line


def test_summary_line_counts_a_check_with_several_findings_once():
    findings = [warning("rank 0", id="nccl-env"), warning("rank 1", id="nccl-env"), ok("fine", id="model-dtype")]
    assert summary_line(findings, SKIPPED) == "3 checks: 0 errors, 2 warnings, 0 info, 1 ok, 1 skipped"


@pytest.mark.parametrize("findings, code", [(FINDINGS, 1), (FINDINGS[1:], 0), ([], 0), ([error("x", id="x")], 1)])
def test_exit_code_is_1_only_with_an_error(findings, code):
    assert exit_code(findings) == code


def test_each_row_starts_with_its_mark_and_check_id():
    rows = [line for line in table().splitlines() if not line.startswith(" ")]
    assert [row[:3] for row in rows[:5]] == ["✗  ", "!  ", "i  ", "✓  ", "-  "]
    assert [row.split()[1] for row in rows[:5]] == [
        "bf16-support",
        "deepspeed-precision",
        "nccl-env",
        "model-dtype",
        "gpu-topology",
    ]
    assert rows[4] == "-  gpu-topology         skipped: no `nvidia-smi topo -m` matrix (give one with --topology)"
    assert rows[5] == "5 checks: 1 error, 1 warning, 1 info, 1 ok, 1 skipped"


def test_titles_and_their_detail_lines_align_after_the_longest_id():
    lines = table().splitlines()
    column = 3 + len("deepspeed-precision") + 2
    assert lines[0] == "✗  bf16-support         bf16 is requested but 4x Tesla V100 lack bf16"
    assert lines[1] == " " * column + "bf16 needs compute capability 8.0"
    assert all(line.index("gradient_clipping") == column for line in lines if line.startswith("!"))


def test_warnings_and_errors_show_detail_fix_and_explain_topic():
    text = table()
    for line in (
        "bf16 needs compute capability 8.0",
        'fix: use fp16: [model].precision = "fp16"',
        "→ sftdoctor explain bf16-support",
        "DeepSpeed stops clipping",
        "fix: set gradient_clipping = auto",
        "→ sftdoctor explain deepspeed-clipping",
    ):
        assert line in text, line


def test_ok_and_info_show_only_their_title_unless_verbose():
    quiet, verbose = table(), table(verbose=True)
    for hidden in ("NCCL_DEBUG=INFO", "fix: unset NCCL_DEBUG for speed", "torch_dtype=bfloat16"):
        assert hidden not in quiet and hidden in verbose, hidden
    assert "explain nccl-env" not in verbose and "explain model-dtype" not in verbose
    assert len(verbose.splitlines()) == len(quiet.splitlines()) + 3


def test_the_summary_line_can_be_left_out():
    assert "checks:" not in table(with_summary=False)
    assert table(with_summary=False).splitlines()[-1].startswith("-  gpu-topology")


def test_a_file_or_pipe_gets_no_colours_and_whole_lines():
    long = "x" * 300
    text = table([error(long, long, long, id="bf16-support", explain="bf16-support")], [])
    assert "\x1b[" not in text
    assert f"✗  bf16-support  {long}\n" in text and f"fix: {long}\n" in text


def test_a_terminal_gets_colours_and_wrapped_lines(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "60")
    out = Terminal()
    render_table([error("word " * 30, id="bf16-support", explain="bf16-support")], SKIPPED, out=out)
    text = out.getvalue()
    assert "\x1b[1;31m✗\x1b[0m" in text and "\x1b[2m-  gpu-topology" in text
    title_lines = [line for line in text.splitlines() if "word" in line]
    assert len(title_lines) > 1


def test_no_color_turns_colours_off_on_a_terminal(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    out = Terminal()
    render_table(FINDINGS, SKIPPED, out=out)
    assert "\x1b[" not in out.getvalue() and out.getvalue().startswith("✗  bf16-support")


def test_a_terminal_narrower_than_the_id_column_still_gets_the_table(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "25")
    out = Terminal()
    render_table([warning("gradient checkpointing is off", id="gradient-checkpointing", explain="x")], [], out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("!  gradient-checkpointing  gradient")
    assert " ".join(line.strip() for line in lines[:-1]).endswith("gradient checkpointing is off → sftdoctor explain x")
    assert lines[-1].startswith("1 check: 0 errors, 1 warning")


def test_render_json_is_one_document_with_summary_exit_code_findings_skipped_and_facts(capsys):
    render_json(FINDINGS, SKIPPED, {"gpus": {"devices": []}, "model_config": {"path": Path("m") / "config.json"}})
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["sftdoctor", "summary", "exit_code", "findings", "skipped", "facts"]
    assert doc["sftdoctor"] == __version__ and doc["exit_code"] == 1
    assert doc["summary"] == {"ok": 1, "info": 1, "warning": 1, "error": 1, "skipped": 1, "silenced": 0}
    assert [f["severity"] for f in doc["findings"]] == ["error", "warning", "info", "ok"]
    assert doc["findings"][1]["fix"] == "set gradient_clipping = auto"
    assert doc["skipped"] == [{"id": "gpu-topology", "reason": SKIPPED[0].reason}]
    assert doc["facts"]["model_config"]["path"] == str(Path("m") / "config.json")


def test_render_json_without_errors_says_exit_code_0(capsys):
    render_json(FINDINGS[1:], [], {})
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 0 and doc["skipped"] == [] and doc["facts"] == {}


def test_render_json_is_strict_json_even_with_a_nan_in_the_evidence(capsys):
    """`check --json` is read back as a facts snapshot, whose reader refuses NaN literals (errors.loads_finite)."""
    render_json(
        [warning("loss", "d", "f", id="x", evidence={"loss": float("nan"), "scale": float("inf")})],
        [],
        {"lr": float("-inf")},
    )

    def refuse(literal):
        raise AssertionError(f"bare {literal} in the output")

    doc = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert doc["findings"][0]["evidence"] == {"loss": "NaN", "scale": "inf"} and doc["facts"] == {"lr": "-inf"}


SILENCED = [dataclasses.replace(FINDINGS[0], id="bf16-support/no-bf16", silenced=True), FINDINGS[3]]


def test_a_silenced_error_is_printed_marked_silenced_with_its_fix_and_does_not_fail():
    lines = table(SILENCED, []).splitlines()
    assert lines[0] == "~  bf16-support/no-bf16  silenced error: bf16 is requested but 4x Tesla V100 lack bf16"
    assert lines[2].strip() == 'fix: use fp16: [model].precision = "fp16"'  # never hidden: detail and fix shown
    assert lines[-1] == "2 checks: 0 errors, 0 warnings, 0 info, 1 ok, 0 skipped, 1 silenced"
    assert exit_code(SILENCED) == 0 and exit_code(FINDINGS) == 1


def test_a_silenced_finding_is_in_the_json_document_marked_and_counted_apart(capsys):
    render_json(SILENCED, [], {})
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 0 and doc["summary"]["error"] == 0 and doc["summary"]["silenced"] == 1
    assert [(f["id"], f["silenced"]) for f in doc["findings"]] == [
        ("bf16-support/no-bf16", True),
        ("model-dtype", False),
    ]


def test_a_findings_section_of_a_topic_is_explained_as_topic_slash_section():
    finding = warning("x", id="nccl-env/shm", explain="nccl-env#shm")
    assert "→ sftdoctor explain nccl-env/shm" in table([finding], [])
