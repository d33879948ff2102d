"""`sftdoctor report` (report/command.py): what it writes, what it records, overlays, and bad input."""

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainrun import start

from sftdoctor.errors import InputError
from sftdoctor.report import command
from sftdoctor.report.command import build

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "curves"


def run_dir(folder: Path, steps: int = 40, drop_at: int | None = None, findings=()) -> Path:
    """A sftdoctor run directory as a run leaves it, with a healthy curve (a throughput that halves at
    `drop_at`, if given) and findings already recorded."""
    folder.mkdir(parents=True)
    records = []
    for step in range(1, steps + 1):
        records.append(
            {
                "step": step,
                "loss": 2 * math.exp(-step / 10) + 0.5,
                "learning_rate": 1e-3 * (1 - step / steps),
                "grad_norm": 0.5,
                "max_grad_norm": 1.0,
                "tokens_seen": 1000 * step,
                "host_rss_gib": 1.0,
                "tokens_per_second": 6000.0 if drop_at and step >= drop_at else 12000.0,
            }
        )
        if step % 10 == 0:
            records.append({"step": step, "eval_loss": 2 * math.exp(-step / 10) + 0.6})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "resolved.json").write_text(
        json.dumps(
            {
                "lr_scheduler": "linear",
                "learning_rate": 1e-3,
                "warmup_steps": 0,
                "total_steps": steps,
                "max_grad_norm": 1.0,
                "precision": "bf16",
            }
        )
    )
    (folder / "findings.jsonl").write_text("".join(json.dumps(f) + "\n" for f in findings))
    return folder


PREFLIGHT = {"phase": "preflight", "severity": "warning", "id": "gpu-topology", "title": "GPUs talk over PCIe"}
RUNTIME = {"phase": "runtime", "step": 12, "severity": "warning", "id": "loss-spike", "title": "loss spike at step 12"}


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "findings.jsonl").read_text().splitlines()]


def test_one_run_gets_its_page_panels_and_postrun_records_once(tmp_path):
    folder = run_dir(tmp_path / "run", drop_at=25, findings=[PREFLIGHT, RUNTIME])
    written = build([folder], plugins=False)
    assert written.html == folder / "report.html"
    assert sorted(p.name for p in written.panels) == [
        "grad-norm.png",
        "learning-rate.png",
        "loss.png",
        "memory.png",
        "throughput.png",
    ]  # no fp16: no loss-scale panel
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written.panels)
    page = written.html.read_text()
    assert page.count("data:image/png;base64,") == 5 and "src='http" not in page  # self-contained
    assert (
        "throughput fell by 50% at step 25" in page
        and "loss spike at step 12" in page
        and "GPUs talk over PCIe" in page
    )
    build([folder], plugins=False)  # a second report records the curve readers' findings once, not twice
    postrun = [r for r in records(folder) if r["phase"] == "postrun"]
    assert sorted(r["id"] for r in postrun) == sorted({r["id"] for r in postrun})
    assert next(r for r in postrun if r["id"] == "throughput-drop/dropped")["step"] == 25
    assert records(folder)[:2] == [PREFLIGHT, RUNTIME]  # the run's own findings are kept as they were
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_findings_are_numbered_and_marked_in_step_order(tmp_path):
    folder = run_dir(tmp_path / "run", drop_at=25, findings=[RUNTIME, PREFLIGHT])
    [judged] = command.load([folder], "step", plugins=False)
    assert [(number, step, r["id"]) for number, step, r in judged.run.marks] == [
        (1, 0, "gpu-topology"),
        (2, 12, "loss-spike"),
        (3, 25, "throughput-drop/dropped"),
    ]


def test_the_rehearsals_findings_are_the_runs_too(tmp_path):
    folder = run_dir(tmp_path / "run")
    (folder / "smoke").mkdir()
    (folder / "smoke" / "findings.jsonl").write_text(json.dumps({**RUNTIME, "step": 3}) + "\n")
    [judged] = command.load([folder], "step", plugins=False)
    assert [(r["phase"], step) for _, step, r in judged.run.marks] == [("rehearsal", 0)]


def test_two_runs_overlay_by_step_or_by_tokens(tmp_path):
    a, b = run_dir(tmp_path / "a" / "run"), run_dir(tmp_path / "b" / "run", steps=30, drop_at=10)
    written = build([a, b], tmp_path / "compare", "tokens", plugins=False)
    page = written.html.read_text()
    assert "sftdoctor report: a/run, b/run" in page  # the same folder names, told apart by their parents
    assert "x axis: tokens seen" in page and "<h3>b/run</h3>" in page
    assert (tmp_path / "compare" / "report" / "loss.png").is_file()
    assert not (a / "report.html").exists()  # written where asked, findings recorded in each run
    assert any(r["phase"] == "postrun" for r in records(b))


def test_a_trainer_directory_is_reported_but_not_written_into(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(FIXTURES / "overfit_cpt_large_adgen.json", folder / "trainer_state.json")
    written = build([folder], plugins=False)
    assert (
        "overfitting: the eval loss stayed above its best for 4 evaluations after step 3294" in written.html.read_text()
    )
    assert not (folder / "findings.jsonl").exists()


def test_tokens_need_a_token_count(tmp_path):
    with pytest.raises(InputError, match="logged no tokens seen .*compare it with --x step"):
        build([FIXTURES / "overfit_cpt_large_adgen.json"], tmp_path / "out", "tokens", plugins=False)


def test_a_failure_while_drawing_leaves_the_earlier_report_whole(tmp_path, monkeypatch):
    folder = run_dir(tmp_path / "run")
    build([folder], plugins=False)
    before = (folder / "report.html").read_text()

    def broken(panel, runs, axis):
        raise OSError("No space left on device")

    monkeypatch.setattr(command, "render", broken)
    with pytest.raises(OSError):
        build([folder], plugins=False)
    assert (folder / "report.html").read_text() == before and len(list((folder / "report").iterdir())) == 5
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sftdoctor", "report", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_the_command_prints_the_verdicts_and_where_the_report_is(tmp_path):
    folder = run_dir(tmp_path / "run", drop_at=25)
    proc = cli(folder, "--no-plugins")
    assert proc.returncode == 0, proc.stderr
    assert "!  throughput-drop/dropped  throughput fell by 50% at step 25" in proc.stdout
    assert proc.stdout.rstrip().endswith(
        f"sftdoctor: report written: {folder / 'report.html'} (5 panels in {folder / 'report'})"
    )
    as_json = json.loads(cli(folder, "--json", "--no-plugins").stdout)
    assert as_json["report"] == str(folder / "report.html")
    assert {f["id"] for f in as_json["runs"][0]["findings"]} >= {"lr-curve", "throughput-drop/dropped"}


@pytest.mark.parametrize(
    "args, says",
    [
        (["nope"], "nope: not found (expected a run directory"),
        (["RUN", "--x", "epochs"], "Invalid value for '--x'"),
        (["RUN", "--output", "FILE"], "exists and is not a folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    folder = run_dir(tmp_path / "run")
    (tmp_path / "FILE").write_text("x")
    proc = cli(*[str(folder) if a == "RUN" else str(tmp_path / a) if a == "FILE" else a for a in args], cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_a_findings_file_that_cannot_be_read_is_bad_input_not_an_empty_history(tmp_path):
    folder = run_dir(tmp_path / "run")
    (folder / "findings.jsonl").unlink(missing_ok=True)
    (folder / "findings.jsonl").mkdir()
    proc = cli(str(folder), "--no-plugins", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr
        == f"sftdoctor: error: {folder / 'findings.jsonl'}: expected a findings record file, got a directory\n"
    )
    assert not (folder / "report.html").exists()


def test_sigterm_while_drawing_leaves_nothing_behind(tmp_path):
    """A scheduler's SIGTERM in the middle of a long report: exit 143, no staging folder, no page."""
    folder = run_dir(tmp_path / "run", steps=60_000)  # long enough to be caught drawing
    proc = start("report", folder, "--no-plugins")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(p.name.startswith(".report-") for p in folder.iterdir()):
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "interrupted; the report was not written" in err and "Traceback" not in err
    assert not (folder / "report.html").exists() and not [p for p in folder.iterdir() if p.name.startswith(".")]


def test_the_ids_a_run_silenced_are_said_after_its_verdicts(tmp_path, capsys):
    silenced = {**PREFLIGHT, "id": "gpu-topology/pcie", "silenced": True}
    folder = run_dir(tmp_path / "run", findings=[silenced, {**RUNTIME, "silenced": False}])
    command.show(build([folder], plugins=False), as_json=False)
    out = capsys.readouterr().out.splitlines()
    assert "sftdoctor: silenced in this run: gpu-topology/pcie ([checks] disable, --disable): shown marked " in out[-2]
