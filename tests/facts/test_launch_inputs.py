"""What `train` needs beyond its config's keys (facts.launch_inputs), decided once for train's gate and
`check --config`: the run directory can be made, the report backend is installed, a hub model is cached or
reachable. Each refusal on a real folder, a real cache layout and a real (loopback) hub."""

import ast
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import make_run
from hostile import SPECIAL, special_file

from sftdoctor.errors import InputErrors
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.launch_inputs import hub_model, problems, reporter_problem
from sftdoctor.files import folder_problem

MISSING_BACKEND = next((b for b in ("wandb", "tensorboard") if find_spec(b) is None), None)


@pytest.mark.parametrize("kind", [k for k in SPECIAL if k != "folder"])
def test_an_output_dir_that_is_not_a_folder_is_named(tmp_path, kind):
    path = special_file(tmp_path / "out", kind)
    assert folder_problem(path) == f"{path} exists and is not a folder"


def test_an_output_dir_under_a_file_cannot_be_made_and_a_new_or_existing_folder_can(tmp_path):
    (tmp_path / "f").write_text("x")
    assert (
        folder_problem(tmp_path / "f" / "a" / "b")
        == f"{tmp_path / 'f'} is not a folder, so {tmp_path / 'f' / 'a' / 'b'} cannot be made in it"
    )
    assert folder_problem(tmp_path / "new" / "deeper") is None
    assert folder_problem(tmp_path) is None


def _as_nobody(func, *args) -> str:
    """func(*args) in a forked child that is the user nobody when this is root (root writes anywhere, a user's run
    does not), its result through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            os.write(write, str(func(*args)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    return said


def test_an_output_dir_in_a_folder_this_user_cannot_write_or_enter_is_named(tmp_path):
    shared = Path(tempfile.mkdtemp(prefix="sftdoctor-test-"))  # under /tmp, which every user may enter
    try:
        shared.chmod(0o755)
        (shared / "locked").mkdir(mode=0o555)
        (shared / "private").mkdir(mode=0o700)
        said = _as_nobody(folder_problem, shared / "locked" / "run")
        assert said.startswith(f"{shared / 'locked'} is not writable by this user (uid ") and said.endswith(
            f"so {shared / 'locked' / 'run'} cannot be made in it"
        ), said
        if os.geteuid() == 0:  # only root's child is another user than the owner
            assert (
                _as_nobody(folder_problem, shared / "private" / "run")
                == f"{shared / 'private' / 'run'} cannot be looked at (Permission denied), so "
                f"{shared / 'private' / 'run'} cannot be made"
            )
    finally:
        shutil.rmtree(shared)


@pytest.mark.skipif(MISSING_BACKEND is None, reason="wandb and tensorboard are both installed here")
def test_a_report_backend_that_is_not_installed_is_refused_with_the_install_command():
    assert reporter_problem(MISSING_BACKEND) == f"{MISSING_BACKEND} is not installed (pip install {MISSING_BACKEND})"
    assert reporter_problem("none") is None


def test_tensorboard_counts_as_installed_as_transformers_counts_it():
    """integration_utils.is_tensorboard_available: tensorboard or tensorboardX."""
    installed = find_spec("tensorboard") is not None or find_spec("tensorboardX") is not None
    assert (reporter_problem("tensorboard") is None) == installed


def _cache(root, model_id, *files, main=True):
    repo = root / ("models--" + model_id.replace("/", "--"))
    (repo / "snapshots" / "abc").mkdir(parents=True)
    for name in files:
        (repo / "snapshots" / "abc" / name).write_text("{}")
    if main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("abc")
    return repo


def test_a_cached_hub_model_is_found_by_huggingface_hubs_own_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache(tmp_path, "org/cached", "config.json")
    _cache(tmp_path, "org/other-revision", "config.json", main=False)
    assert hub_model("org/cached") == ("cached", None)
    assert hub_model("org/other-revision") == (
        "offline",
        "org/other-revision is not in the local Hugging Face cache and HF_HUB_OFFLINE=1",
    )


def test_a_hub_model_the_cache_records_as_absent_is_not_found(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = _cache(tmp_path, "org/gguf-only")
    (repo / ".no_exist" / "abc").mkdir(parents=True)
    (repo / ".no_exist" / "abc" / "config.json").write_text("")
    assert hub_model("org/gguf-only") == (
        "missing",
        "org/gguf-only has no config.json on the hub (the local Hugging Face cache records it as absent)",
    )


@pytest.mark.parametrize(
    "name, value", [("HF_HUB_OFFLINE", "1"), ("HF_HUB_OFFLINE", "yes"), ("TRANSFORMERS_OFFLINE", "1")]
)
def test_offline_is_read_as_huggingface_hub_reads_it_and_asks_no_network(tmp_path, monkeypatch, name, value):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_ENDPOINT", "http://192.0.2.1:9")  # TEST-NET: a network call would fail the test
    assert hub_model("org/m") == ("offline", f"org/m is not in the local Hugging Face cache and {name}={value}")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _online(model_id: str, cache, endpoint: str) -> tuple[str, str | None]:
    """hub_model in a fresh process, online (huggingface_hub reads HF_HUB_OFFLINE once, when it is imported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    code = "import sys; from sftdoctor.facts.launch_inputs import hub_model; print(repr(hub_model(sys.argv[1])))"
    out = subprocess.run(
        [sys.executable, "-c", code, model_id],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": endpoint},
    )
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip())


@pytest.mark.slow  # a fresh process each: 1.5 s
def test_an_uncached_hub_model_with_the_hub_unreachable_says_so(tmp_path):
    state, why = _online("org/m", tmp_path, f"http://127.0.0.1:{_closed_port()}")
    assert state == "unreachable"
    assert why.startswith("org/m is not in the local Hugging Face cache, and the Hugging Face hub cannot be reached (")


class NoSuchRepo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the hub's answer for a repository it does not have
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.mark.slow  # a fresh process each: 1.5 s
def test_an_uncached_hub_model_the_hub_does_not_have_says_so(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        assert _online("org/none", tmp_path, endpoint) == (
            "unreachable",
            "org/none is not in the local Hugging Face cache, and the hub has no such model (or it is "
            "private: log in with hf auth login)",
        )
    finally:
        server.shutdown()


def test_an_id_that_is_neither_a_folder_nor_a_hub_id_is_named():
    state, why = hub_model("org/na me")
    assert state == "invalid" and why.startswith("not a local folder, nor a hub id (")


def test_every_problem_of_a_run_is_named_at_once_with_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "out").write_text("")
    run = make_run(
        tmp_path,
        model={"path": "org/m", "tokenizer": "org/t"},
        training={"output_dir": "out"},
        report={"to": MISSING_BACKEND or "none"},
    )
    errors, models = problems(run, tmp_path / "run.toml")
    keys = [e.key for e in errors]
    assert keys == ["[training].output_dir"] + (["[report].to"] if MISSING_BACKEND else []) + [
        "[model].path",
        "[model].tokenizer",
    ]
    assert models == {"org/m": "offline", "org/t": "offline"}


def test_the_fact_raises_them_as_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "run.toml").write_text(
        '[model]\npath = "m"\nweights = "random"\n[data]\ntrain = "d.jsonl"\n[training]\noutput_dir = "d.jsonl"\n'
    )
    (tmp_path / "m").mkdir()
    with pytest.raises(InputErrors, match=r"\[training\]\.output_dir: .*d\.jsonl exists and is not a folder"):
        Facts(Inputs(config=tmp_path / "run.toml")).get("launch_inputs")
