"""The `sftdoctor` command. Each command imports what it needs inside its callback, so
`--help`, `check` and `explain` never pay for torch or the training stack."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from sftdoctor import __version__

EXIT_BAD_INPUT = 2


class Finite(click.FloatRange):
    """A FloatRange that also refuses nan and inf (click's comparisons let nan through)."""

    def convert(self, value, param, ctx):
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class NonEmptyPath(click.Path):
    """A path that is not "" (an unset shell variable: `--config $CFG`), which click turns into ".", the current
    folder, and the command then calls a folder where a file was meant."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path (an unset shell variable?)", param, ctx)
        return super().convert(value, param, ctx)


PATH = NonEmptyPath(path_type=Path)


def _input_options(func):
    options = [
        click.option("--config", "config", type=PATH, help="The run config (TOML) of `sftdoctor train`."),
        click.option("--model-config", type=PATH, help="A model's config.json, or its folder."),
        click.option("--deepspeed", type=PATH, help="A DeepSpeed JSON config."),
        click.option("--fsdp", type=PATH, help="An accelerate FSDP config (the YAML `accelerate config` writes)."),
        click.option(
            "--topology", type=PATH, help="A saved `nvidia-smi topo -m` output, read instead of the local one."
        ),
        click.option(
            "--facts",
            "facts_file",
            type=PATH,
            help="Replay a saved facts snapshot (`sftdoctor facts`) instead of probing.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


# `check` and `train` silence alike: a finding of these ids is still shown, marked silenced, and counts toward
# neither the exit code nor the gate (as pylint's --disable); with the run config's [checks] disable.
_disable_option = click.option(
    "--disable",
    multiple=True,
    metavar="ID[,ID...]",
    help="Silence a check (all its findings) or one of its messages (CHECK/slug, see --list); repeatable.",
)


def _inputs(config, model_config, deepspeed, fsdp, topology, facts_file):
    from sftdoctor.facts import Inputs

    return Inputs(
        config=config, model_config=model_config, deepspeed=deepspeed, fsdp=fsdp, topology=topology, facts=facts_file
    )


STACK = {"torch", "transformers", "trl", "accelerate", "datasets", "deepspeed", "liger_kernel"}


def _missing_stack(exc: ModuleNotFoundError, command: str) -> None:
    """A light install (`pip install -e .`) checks a box; `train` needs the training stack."""
    if (exc.name or "").split(".")[0] not in STACK:
        raise exc
    click.echo(
        f"sftdoctor: error: `sftdoctor {command}` needs {exc.name}, which is not installed: install the training "
        "stack with pip install 'sftdoctor[train]' (torch first, the build for your driver)",
        err=True,
    )
    sys.exit(EXIT_BAD_INPUT)


def _refuse(exc) -> None:
    """An SftdoctorError (bad input, a gate that does not start the run, a stopped run): its lines (one per problem),
    its exit code, no traceback."""
    for line in exc.lines():
        click.echo(line, err=True)
    sys.exit(exc.exit_code)


class UsageLine(click.ClickException):
    """A usage error as one line like every other refusal (click prints usage, a hint and the error on four)."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, exc: click.UsageError):
        super().__init__(" ".join(exc.format_message().split()))
        self.command = exc.ctx.command_path if exc.ctx else "sftdoctor"

    def show(self, file=None) -> None:
        click.echo(f"sftdoctor: error: {self.command}: {self.message} (see {self.command} --help)", err=True)


# click >= 8.2 raises this for a bare `sftdoctor`: it prints the help, which stays as it is.
_HELP_FOR_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())


class Doctor(click.Group):
    """Parses the command line, its subcommand's too, turning each usage error into one line; runs the command,
    turning an SftdoctorError into its lines and exit code."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except _HELP_FOR_NO_ARGS:
            raise
        except click.UsageError as exc:
            raise UsageLine(exc) from None

    def invoke(self, ctx):
        from sftdoctor.errors import SftdoctorError

        try:
            return super().invoke(ctx)
        except _HELP_FOR_NO_ARGS:
            raise
        except click.UsageError as exc:
            raise UsageLine(exc) from None
        except SftdoctorError as exc:  # the one place every command's refusal is printed and exits
            _refuse(exc)


@click.group(cls=Doctor, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sftdoctor")
def main():
    """Find what will break an LLM fine-tuning run before it starts, and say how to fix it."""


def _one_of(*decls, choices: list[str], help: str):
    """An option that names one of `choices`; the first is the default."""
    return click.option(*decls, type=click.Choice(choices), default=choices[0], show_default=True, help=help)


def _with_distributed(*decls, help, **attrs):
    """An option that only `check --distributed` reads (refused without it by _options_of_one_mode)."""
    return click.option(*decls, show_default=True, help="With --distributed: " + help, **attrs)


def _options_of_one_mode(distributed: bool, disable: tuple[str, ...]) -> None:
    """An option of `check --distributed` without it, or --disable with it, would be silently ignored, and read as if
    it had been applied: refused."""
    ctx = click.get_current_context()
    alone = [
        name
        for name in ("seconds", "bound", "out", "drill")
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    ]
    if alone and not distributed:
        click.echo(f"sftdoctor: error: --{alone[0]}: goes with --distributed", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if disable and distributed:  # the cluster's verdict is one; nothing in it is silenced
        click.echo("sftdoctor: error: --disable: does not go with --distributed", err=True)
        sys.exit(EXIT_BAD_INPUT)


@main.command()
@_input_options
@click.option("--select", help="Run only these checks, or one message of a check (CHECK/slug); comma-separated ids.")
@_disable_option
@click.option("--list", "list_checks", is_flag=True, help="List the checks and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print facts and findings as one JSON document.")
@click.option(
    "--no-plugins",
    is_flag=True,
    help="Do not load third-party checks (entry points 'sftdoctor.checks'; "
    "or set SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1).",
)
@click.option("-v", "--verbose", is_flag=True, help="Show detail and fix for every finding, not only problems.")
@click.option(
    "--distributed",
    is_flag=True,
    help="Run on every rank under torchrun: one verdict for the whole job, "
    "with all-reduce bandwidth and correctness. --facts may name one snapshot per rank ({rank}, {node}).",
)
@_with_distributed("--seconds", type=Finite(min=0.1), default=10.0, help="time budget of the all-reduce sweep.")
@_with_distributed(
    "--bound", type=Finite(min=1.0), default=60.0, help="seconds to wait for a rank to join, or a collective to finish."
)
@_with_distributed(
    "--out",
    type=PATH,
    default=Path("sftdoctor-distributed"),
    help="where each rank's record and the findings are written.",
)
@_with_distributed("--drill", help="absent:RANK keeps that rank away, to see it named.")
def check(
    config,
    model_config,
    deepspeed,
    fsdp,
    topology,
    facts_file,
    select,
    disable,
    list_checks,
    as_json,
    no_plugins,
    verbose,
    distributed,
    seconds,
    bound,
    out,
    drill,
):
    """Run the preflight checks. Exit 0: no error; 1: an error finding; 2: bad input."""
    _options_of_one_mode(distributed, disable)
    if distributed:
        from sftdoctor.distributed.command import main as distributed_main

        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            click.echo(
                "sftdoctor: error: --distributed runs under a launcher: torchrun --nproc-per-node G "
                "-m sftdoctor check --distributed",
                err=True,
            )
            sys.exit(EXIT_BAD_INPUT)
        from sftdoctor.checks import plugins_enabled

        code = distributed_main(
            bound,
            seconds,
            out,
            str(facts_file) if facts_file else None,
            as_json,
            drill,
            plugins=plugins_enabled(no_plugins),
        )
        sys.exit(code)
    from sftdoctor.checks import plugins_enabled
    from sftdoctor.checks.command import main as check_main

    code = check_main(
        _inputs(config, model_config, deepspeed, fsdp, topology, facts_file),
        select,
        list_checks,
        as_json,
        plugins_enabled(no_plugins),
        verbose,
        disable,
    )
    sys.exit(code)


@main.command()
@_input_options
def facts(config, model_config, deepspeed, fsdp, topology, facts_file):
    """Probe this machine and print the facts snapshot as JSON (replay it with `check --facts`)."""
    from sftdoctor.facts.command import main as facts_main

    facts_main(_inputs(config, model_config, deepspeed, fsdp, topology, facts_file))


@main.command()
@click.argument("config", type=PATH)
@click.option("--resume", is_flag=True, help="Continue from the newest complete checkpoint in the run directory.")
@click.option("--dry-run", is_flag=True, help="Resolve, run the checks and print the plan; do not train.")
@click.option(
    "--smoke", is_flag=True, help="Rehearse the whole pipeline in seconds on a shrunk model, with a save and a resume."
)
@click.option("--force", is_flag=True, help="Start even when a check finds an error (recorded in the run directory).")
@click.option(
    "--drill",
    help="Inject a fault to prove the alarms work: nan-loss@STEP[:RANK], nan-row@STEP[:RANK] (a "
    "row that is non-finite wherever it runs), hang@STEP[:RANK], desync@STEP[:RANK] (that rank calls "
    "another collective), slow@STEP[:RANK] or slow-data@STEP[:RANK] (that rank's forward pass or batch fetch "
    "three times slower at every step from STEP).",
)
@click.option(
    "--no-plugins", is_flag=True, help="Do not load third-party checks (or set SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1)."
)
@click.option("--no-rehearse", is_flag=True, help="Skip the rehearsal before a multi-process or DeepSpeed run.")
@_disable_option
@click.option(
    "--sbatch",
    is_flag=True,
    help="Write RUN_DIR/sbatch.sh, the run as a Slurm batch job ([slurm] in CONFIG), instead of training here.",
)
@click.option("--submit", is_flag=True, help="With --sbatch: also submit it (sbatch) and print the job id.")
def train(config, drill, no_plugins, no_rehearse, sbatch, submit, **as_given):
    """Fine-tune with the settings in CONFIG (TOML), after the checks pass."""
    from sftdoctor.checks import plugins_enabled
    from sftdoctor.errors import InputError
    from sftdoctor.train.command import main as run_training
    from sftdoctor.train.drills import parse_drill

    _sigterm_interrupts()
    try:
        if submit and not sbatch:
            raise InputError("--submit", "goes with --sbatch")
        fault = parse_drill(drill) if drill is not None else None
        # as_given: --resume, --dry-run, --smoke, --force and --disable, under the names train.command reads
        code = run_training(
            config,
            drill=fault,
            plugins=plugins_enabled(no_plugins),
            rehearse_first=not no_rehearse,
            batch="submit" if submit else "write" if sbatch else None,
            **as_given,
        )
    except ModuleNotFoundError as exc:
        _missing_stack(exc, "train")
    except KeyboardInterrupt:  # during the checks, before any worker started: a probe's child is killed on the way out
        name, code = ("SIGTERM", 143) if _terminated else ("SIGINT", 130)
        click.echo(f"\nsftdoctor: interrupted ({name}) before training started", err=True)
        sys.exit(code)
    sys.exit(code)


_terminated: list[int] = []


def _sigterm_interrupts() -> None:
    """SIGTERM (scancel, docker stop) unwinds like Ctrl-C: subprocess.run kills the probe it waits on, instead of
    this process dying and leaving it running. The launcher installs its own handlers while workers run."""
    import signal

    def interrupt(signum, frame):
        _terminated.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@main.command("sweep")
@click.argument("sweep_file", metavar="SWEEP.toml", type=PATH)
@click.option(
    "--facts",
    "facts_file",
    type=PATH,
    help="Judge the trials (the gate, the narrowing) on a recorded machine's facts (`sftdoctor facts`) "
    "instead of this one's; with --dry-run, see what fits there.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the sweep file, narrow the space and show it, with the study so far; run no trial.",
)
@click.option(
    "--no-plugins", is_flag=True, help="Do not load third-party checks (or set SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1)."
)
def sweep_command(sweep_file, facts_file, dry_run, no_plugins):
    """Search hyperparameters: each trial a `sftdoctor train` run of the base config with one point of the
    space, through the same gate (a setting the checks refuse is pruned before it launches), Optuna's
    sampler and pruner, the study in SWEEP_DIR/study.journal (rerun to resume; run it on several nodes to
    share it). At the end: the table, best.toml, the pictures and the best runs' report.

    Exit 0: a trial completed; 1: none did; 2: bad input; 130/143: stopped (rerun to go on)."""
    from importlib.util import find_spec

    from sftdoctor.checks import plugins_enabled

    if find_spec("optuna") is None:
        click.echo(
            "sftdoctor: error: `sftdoctor sweep` needs optuna, which is not installed: pip install 'sftdoctor[sweep]'",
            err=True,
        )
        sys.exit(EXIT_BAD_INPUT)
    from sftdoctor.sweep.command import main as sweep_main

    try:
        code = sweep_main(sweep_file, facts_file, dry_run=dry_run, plugins=plugins_enabled(no_plugins))
    except ModuleNotFoundError as exc:
        _missing_stack(exc, "sweep")
    sys.exit(code)


class Size(click.ParamType):
    """A memory size: 80GiB, 80GB, 81920MiB, 40G."""

    name = "size"
    UNITS = {
        "": 1,
        "B": 1,
        "K": 2**10,
        "KB": 10**3,
        "KIB": 2**10,
        "M": 2**20,
        "MB": 10**6,
        "MIB": 2**20,
        "G": 2**30,
        "GB": 10**9,
        "GIB": 2**30,
        "T": 2**40,
        "TB": 10**12,
        "TIB": 2**40,
    }

    def convert(self, value, param, ctx):
        import re

        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        unit = match.group(2).upper() if match else None
        if not match or unit not in self.UNITS:
            self.fail(f"{value!r} is not a size like 80GiB, 80GB or 81920MiB", param, ctx)
        number = float(match.group(1))  # 400 digits read as inf: refused below, never int(inf)
        if number * self.UNITS[unit] > MAX_GPU_MEMORY:
            self.fail(f"{value!r} is more than {MAX_GPU_MEMORY // 2**40} TiB of GPU memory", param, ctx)
        size = int(number * self.UNITS[unit])
        if size < 2**20:
            self.fail(f"{value!r} is less than 1 MiB of GPU memory", param, ctx)
        return size


# Bounds of the counts `plan` is given, each generous beyond any real machine, so that no count reaches the memory
# (a GPU record per planned GPU) or the arithmetic. GPUs per node and nodes are [launch] nproc_per_node's and
# nnodes's bounds in run/config.py (tests/plan/test_bounds.py holds them equal): the largest hosts carry 8 or 16
# GPUs (HGX, DGX-2; a GB200 NVL72 rack is 18 hosts of 4), and 65536 nodes of 8 are 524288 GPUs, beyond the largest
# clusters built (about 200000: xAI's Colossus; Llama 3 405B trained on 16384). The largest GPU memory is 288 GB
# (B300, MI355X): 4 TiB is ten times more.
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 2**16
MAX_GPU_MEMORY = 4 * 2**40


@main.command()
@click.argument("config", type=PATH)
@click.option("--gpu-memory", type=Size(), help="Plan for GPUs of this memory (e.g. 80GiB) instead of the ones found.")
@click.option(
    "--gpus",
    "gpus_per_node",
    type=click.IntRange(1, MAX_GPUS_PER_NODE),
    help="GPUs per node to plan for (default: the run's).",
)
@click.option("--nodes", type=click.IntRange(1, MAX_NODES), help="Nodes to plan for (default: the run's).")
@click.option("--mfu", type=Finite(0.01, 1.0), default=0.4, show_default=True, help="Assumed model-FLOPs utilisation.")
@click.option("--peak-tflops", type=Finite(min=1), help="The GPU's dense bf16 peak, if sftdoctor does not know it.")
@click.option(
    "--tokens-per-second", type=Finite(min=1), help="Measured throughput (e.g. of a --smoke run) instead of MFU."
)
@click.option("--json", "as_json", is_flag=True, help="Every term of every candidate as one JSON document.")
def plan(config, as_json, **what_if):
    """Will CONFIG fit, what is the fastest setting that does, and how long will it take."""
    from sftdoctor.plan.command import main as plan_main

    code = plan_main(config, as_json, **what_if)
    sys.exit(code)


@main.command("eval")
@click.argument("target", required=False)
@click.option("--tasks", metavar="NAMES", help="lm-eval tasks, comma-separated (e.g. mmlu,gsm8k,hellaswag).")
@click.option("--base", metavar="MODEL", help="Also evaluate this model (the base), side by side with the difference.")
@click.option("--include", type=PATH, help="A folder of lm-eval task YAMLs of your own (with their local data).")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many examples per task.")
@click.option("--num-fewshot", type=click.IntRange(min=0), help="Few-shot examples (default: each task's own).")
@click.option(
    "--batch-size", default=None, metavar="N|auto", help="Per forward pass (default: auto on a GPU, 8 on a CPU)."
)
@click.option(
    "--compare", type=PATH, help="A result of an earlier `sftdoctor eval` to compare with (same settings only)."
)
@click.option(
    "--out", type=PATH, help="Where to write the result (default: RUN_DIR/eval.json, or eval.json in the model folder)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document.")
@click.option(
    "--code",
    "code_problems",
    type=PATH,
    metavar="PROBLEMS.jsonl",
    help="Score generated code on these HumanEval-format problems; every sample runs in a sandbox.",
)
@click.option(
    "--completions",
    type=PATH,
    metavar="FILE",
    help="With --code: the samples to score (task_id + completion lines, several per task).",
)
@click.option("--model", "code_model", metavar="TARGET", help="With --code: generate the samples with this model.")
@click.option(
    "--samples", type=click.IntRange(min=1), default=1, show_default=True, help="With --model: samples per problem."
)
@click.option(
    "--k", "k_values", metavar="K,...", help="With --code: pass@k for these k (default: 1 and the samples per task)."
)
@_one_of(
    "--sandbox",
    "sandbox_kind",
    choices=["bubblewrap", "docker"],
    help="With --code: where the samples run (there is no unsandboxed mode).",
)
@click.option("--workers", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default="CPUs")
@click.option(
    "--timeout",
    "timeout_s",
    type=Finite(min=0.1),
    default=10.0,
    show_default=True,
    help="With --code: wall-clock seconds per sample.",
)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=512, show_default=True)
@click.option(
    "--temperature",
    type=Finite(min=0.0),
    default=0.2,
    show_default=True,
    help="With --model (0.2: the pass@1 setting of Chen et al.).",
)
def eval_command(target, tasks, **options):
    """Evaluate a fine-tuned model (a run directory, checkpoint, model folder or hub id) with
    lm-evaluation-harness, against its base with --base; or (--code) score generated code in a sandbox.

    Exit 0: evaluated; 1: some code samples could not be run; 2: bad input (an unknown task, a missing model,
    a result with other settings, no sandbox)."""
    # lm-eval's own bars (building requests) obey only this, read when tqdm is first imported; put back after,
    # so that processes started later by the same caller are not affected.
    before = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        _eval(target, tasks, options)
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


def _eval(target, tasks, options):
    from sftdoctor.eval.command import main as eval_main

    try:
        code = eval_main(target, tasks, **options)
    except ModuleNotFoundError as exc:
        _missing_stack(exc, "eval --model" if options["code_problems"] is not None else "eval")
    sys.exit(code)


@main.command()
@click.argument("target")
@click.option("--prompt", metavar="TEXT", help="Ask this, print the answer and its stop report, and exit.")
@click.option(
    "--prompts",
    type=PATH,
    metavar="FILE.jsonl",
    help='Ask each line: {"prompt": TEXT} or {"messages": [chat turns]}; for scripts.',
)
@click.option("--base", metavar="MODEL", help="Ask this model too (the base), its answer after TARGET's.")
@click.option(
    "--max-new-tokens",
    type=click.IntRange(1, 1_000_000),
    help="At most this many tokens per answer (default: the generation config's, else 256).",
)
@click.option(
    "--temperature",
    type=Finite(min=0.0, max=100.0),
    help="Sample at this temperature; 0 is greedy (default: the generation config's; greedy with --json).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per answer (JSON Lines).")
def chat(target, **options):
    """Talk to a model (a run directory, checkpoint, model folder or hub id) with the chat template and generation
    config saved with it: a conversation on a terminal, or --prompt / --prompts for scripts. After each answer:
    whether it ended its turn or ran to max_new_tokens, and tokens/s.

    Exit 0: answered; 2: bad input (not a model, a bad prompts line, no terminal to talk on); 130 or 143: a run
    of --prompt/--prompts stopped by Ctrl-C or SIGTERM."""
    from sftdoctor.chat.command import main as chat_main

    try:
        code = chat_main(target, **options)
    except ModuleNotFoundError as exc:
        _missing_stack(exc, "chat")
    sys.exit(code)


@main.command()
@click.argument("topic", required=False)
@click.option("--list", "list_topics", is_flag=True, help="List the topics with one-line summaries.")
@click.option(
    "--log", "log_file", metavar="FILE", help="Triage a failed run's log (- for stdin): the root cause first."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the diagnosis (--log), the topic or the topics as one JSON document."
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    help="With --log: processes for a large log file (default: CPUs, at most 8).",
)
def explain(topic, list_topics, log_file, as_json, jobs):
    """Explain a finding's topic, or (--log) say what went wrong in a run's log.

    With --log, exit 0: nothing recognised; 1: a problem found; 2: bad input."""
    from sftdoctor.triage.command import main as explain_main

    code = explain_main(topic, list_topics, log_file, as_json, jobs)
    sys.exit(code)


@main.command()
@click.argument("run_a", type=PATH)
@click.argument("run_b", type=PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the differences as one JSON document.")
def diff(run_a, run_b, as_json):
    """What differs between two runs (run directories of `sftdoctor train`), the likely causes first: the data
    files, the plan's settings, the stack and the GPUs, the environment; and the step where the losses part.

    Exit 0: nothing that changes a run's numbers differs; 1: something does; 2: bad input."""
    from sftdoctor.diff.command import main as diff_main

    code = diff_main(run_a, run_b, as_json)
    sys.exit(code)


@main.command("mcp")
def mcp_command():
    """Serve check, explain, plan, diff and report to a coding agent as Model Context Protocol tools on stdio,
    each answering the JSON its command prints with --json. The tools only read: none trains or writes outside
    the server's temporary folder. An MCP client starts this command; see the README for its registration."""
    from sftdoctor.mcp.command import main as mcp_main

    code = mcp_main()
    if code:  # Ctrl-C or SIGTERM: a tool still running in a worker thread is not waited for (its probes die with us)
        sys.stderr.flush()
        os._exit(code)


@main.command()
@click.argument("runs", nargs=-1, required=True, type=PATH)
@click.option(
    "--output",
    "-o",
    type=PATH,
    help="Folder to write report.html and its panels in (default: the run directory; with several runs, "
    "./sftdoctor-report).",
)
@_one_of("--x", "by", choices=["step", "tokens"], help="Align the runs by optimizer step or by tokens seen.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the curve readers' findings and the files written as JSON."
)
@click.option(
    "--no-plugins", is_flag=True, help="Do not load third-party checks (or set SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1)."
)
@click.option(
    "--follow",
    is_flag=True,
    help="Keep the page of a running run up to date (curves, the watchers' findings) until it ends; run it on "
    "node 0's host.",
)
@click.option(
    "--interval",
    type=Finite(min=0.5, max=3600),
    help="With --follow: seconds between looks at the run's files  [default: 5]",
)
@click.option(
    "--serve",
    "port",
    type=click.IntRange(0, 65535),
    help="With --follow: also serve the page on 127.0.0.1:PORT (0: a free port), for ssh -L.",
)
def report(runs, output, by, as_json, no_plugins, follow, interval, port):
    """Draw a run's curves (loss, learning rate, gradient norm, loss scale, throughput, memory) into one
    self-contained report.html with a PNG per panel, its findings marked at their step, and read them with the
    curve readers. RUNS: sftdoctor run directories, Trainer output directories (trainer_state.json), or
    those files; several are overlaid. With --follow, one run directory's page is drawn again whenever the run
    writes, from a process of its own at a lower CPU priority, until the run ends.

    Exit 0: written (1 if a curve reader found an error; with --follow, 0 once the run ended and its final page is
    written); 2: bad input."""
    from importlib.util import find_spec

    from sftdoctor.checks import plugins_enabled
    from sftdoctor.errors import Interrupted
    from sftdoctor.report.command import main as report_main

    if find_spec("matplotlib") is None:
        click.echo(
            "sftdoctor: error: `sftdoctor report` draws with matplotlib, which is not installed: "
            "pip install 'sftdoctor[report]'",
            err=True,
        )
        sys.exit(EXIT_BAD_INPUT)
    if not follow and (interval is not None or port is not None):
        click.echo(
            f"sftdoctor: error: {'--interval' if interval is not None else '--serve'}: goes with --follow", err=True
        )
        sys.exit(EXIT_BAD_INPUT)
    try:
        if follow:
            from sftdoctor.report.follow import main as follow_main

            code = follow_main(list(runs), output, by, as_json, plugins_enabled(no_plugins), interval, port)
        else:
            code = report_main(list(runs), output, by, as_json, plugins_enabled(no_plugins))
    except Interrupted as exc:
        click.echo(
            "\nsftdoctor: interrupted; "
            + (
                "the page left is the last one written, whole"
                if follow
                else "the report was not written (an earlier one is left as it was)"
            ),
            err=True,
        )
        sys.exit(128 + exc.signum)
    sys.exit(code)
