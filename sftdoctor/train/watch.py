"""The run's watchers: non-finite losses stopped before the optimizer step, loss spikes, fp16 loss
scaling, and hung collectives (a watchdog thread per rank). Findings go through the same runtime
checks as everything else, are printed on rank 0 and appended to the run's findings.jsonl.

Cost per optimizer step: the gradient norm's finiteness is read once. DeepSpeed and fp16 AMP have
already materialised it (or the overflow flag) on the host; under bf16/fp32 without DeepSpeed it is one
scalar device-to-host read per optimizer step (not per micro-step). Nothing else syncs per step.
"""

from __future__ import annotations

import collections
import faulthandler
import functools
import json
import math
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from sftdoctor import render
from sftdoctor.checks import load_checks, run_check, silence, silenced_by
from sftdoctor.errors import RunStopped
from sftdoctor.facts import flight_recorder
from sftdoctor.facts.catalogue import fact_names
from sftdoctor.facts.flight_recorder import FR_DIR
from sftdoctor.files import write_atomic
from sftdoctor.findings import Finding
from sftdoctor.run import Plan
from sftdoctor.run.checkpoints import newest_complete
from sftdoctor.run.layout import FINDINGS, STOPPED
from sftdoctor.train import compat, rows

NAN_EXIT = 86  # stopped on a non-finite loss
HANG_EXIT = 87  # stopped by the hang watchdog
FR_KEY = "sftdoctor/flight-recorder"
STACKS_KEY = "sftdoctor/hang/stacks"
PID_KEY = "sftdoctor/hang/pid"
# The swap's reads beyond its own deadline: the dumps of 64 ranks take seconds on a live store. The tests' runs of 2
# ranks set SFTDOCTOR_SWAP_MARGIN_S lower rather than wait out 30 s on a frozen store.
SWAP_MARGIN_S = float(os.environ.get("SFTDOCTOR_SWAP_MARGIN_S") or 30.0)
DONE_KEY = "sftdoctor/hang/done"
ROWS_KEY = "sftdoctor/nan-rows"
REPORT_WAIT_S = 120.0  # the reporting rank's analysis: 0.1 s at 2 ranks, 7 s at 64 (bench/flight_recorder.py)
TRAINING_PHASE = "forward/backward"
SPIKE_QUIET = 50  # steps after a loss-spike finding before the next one (a divergence is one event)


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class RuntimeFacts:
    """The facts of one moment of the run (a step's statistics, a logged loss, a hang report)."""

    def __init__(self, values: dict[str, Any]):
        unknown = set(values) - set(fact_names("runtime"))
        if unknown:  # the checks would wait for a name no check can ask for (facts/catalogue.py)
            raise ValueError(f"not runtime facts of the catalogue: {sorted(unknown)}")
        self.values = values

    def known(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def why_missing(self, name: str) -> str:
        return f"no {name} at this point of the run"


class Reporter:
    """Runs the runtime checks, built-in and third-party alike, on the facts of the moment: every check whose
    required facts are there runs (the others wait for theirs). Rank 0 prints the findings and appends them
    to findings.jsonl. A finding of an id the plan silences (--disable, [checks] disable) is marked silenced
    there, as the gate marks it: still shown and recorded, and `acts` says the watchers must not act on it."""

    def __init__(self, run_dir: Path, plugins: bool, silenced: tuple[str, ...] = ()):
        self.run_dir, self.silenced = run_dir, tuple(silenced)
        self.specs = load_checks(plugins).phase("runtime")

    def acts(self, id: str) -> bool:
        """Whether the watchers act on this check's or message's finding (stop the run): not when silenced."""
        return not silenced_by(id, self.silenced)

    def check(self, **facts: Any) -> list[Finding]:
        moment, found = RuntimeFacts(facts), []
        for spec in self.specs:
            if all(name in facts for name, required in spec.facts if required):
                outcome = run_check(spec, moment)
                found += outcome if isinstance(outcome, list) else []
        return silence(found, self.silenced)

    def publish(self, findings: list[Finding], step: int, force: bool = False) -> None:
        if not findings or (rank_world()[0] != 0 and not force):
            return
        render.render_table(findings, [], with_summary=False)
        sys.stdout.flush()
        with open(self.run_dir / FINDINGS, "a", encoding="utf-8") as log:
            for finding in findings:
                log.write(
                    json.dumps(
                        {
                            "phase": "runtime",
                            "step": step,
                            "rank": rank_world()[0],
                            "time": time.time(),
                            **finding.to_json(),
                        },
                        default=str,
                    )
                    + "\n"
                )

    def stopped(self, code: int, finding: Finding) -> None:
        write_atomic(
            self.run_dir / STOPPED, json.dumps({"exit_code": code, "id": finding.id, "title": finding.title}) + "\n"
        )


# ---------------------------------------------------------------- where a NaN comes from


def _first_tensor(output: Any):
    if torch.is_tensor(output):
        return output
    if isinstance(output, (tuple, list)) and output:
        return _first_tensor(output[0])
    return getattr(output, "logits", None)


def attribute(model, inputs: dict[str, Any]) -> str:
    """Re-run the offending batch once with forward hooks: the first module (in completion order) whose
    output is non-finite, and whether inputs or weights were already non-finite."""
    bad_weights = [
        n for n, p in model.named_parameters() if p.numel() and p.is_floating_point() and not torch.isfinite(p).all()
    ]
    bad_inputs = [
        k for k, v in inputs.items() if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()
    ]
    first: list[str] = []
    names = {module: name or type(module).__name__ for name, module in model.named_modules()}

    def hook(module, args, output):
        tensor = _first_tensor(output)
        if not first and torch.is_tensor(tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all():
            first.append(f"{names[module]} ({type(module).__name__})")

    handles = [module.register_forward_hook(hook) for module in names]
    try:
        with torch.no_grad():
            out = model(**{k: v for k, v in inputs.items() if k != "use_cache"}, use_cache=False)
        loss = getattr(out, "loss", None)
    except Exception as exc:  # attribution must never hide the finding itself
        return f"Re-running the batch for attribution failed: {type(exc).__name__}: {exc}."
    finally:
        for handle in handles:
            handle.remove()
    said = [
        f"Weights already non-finite: {', '.join(bad_weights[:5])}." if bad_weights else "Weights were finite.",
        f"Non-finite inputs: {', '.join(bad_inputs)}." if bad_inputs else "Inputs were finite.",
    ]
    if first:
        said.insert(0, f"Re-running the batch, the first module whose output went non-finite is {first[0]}.")
    elif loss is not None and not torch.isfinite(loss).all():
        said.insert(0, "Re-running the batch, every module's output was finite but the loss was not.")
    else:
        said.insert(
            0,
            "Re-running the batch, every module's output and the loss were finite: the non-finite value "
            "arose in this step's loss (as a nan-loss drill injects it) or in the backward pass.",
        )
    return " ".join(said)


# ---------------------------------------------------------------- hangs


def _where(thread_id: int) -> str:
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "?"
    stack = traceback.extract_stack(frame)[-2:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack))


def _in_collective(where: str) -> bool:
    return any(k in where for k in ("distributed_c10d", "graph.py", "autograd", "comm.py", "barrier"))


def behind(reports: dict[int, dict[str, Any]], world: int) -> list[int]:
    """Which rank(s) hold the others up: missing ones; else those at a lower step; else the minority
    phase (a phase other than training breaks ties); else those not waiting in a collective."""
    if world == 1:
        return [0]
    missing = [r for r in range(world) if r not in reports]
    if missing:
        return missing
    steps = {r: info["step"] for r, info in reports.items()}
    if len(set(steps.values())) > 1:
        low = min(steps.values())
        return sorted(r for r, s in steps.items() if s == low)
    phases = collections.Counter(info["phase"] for info in reports.values())
    if len(phases) > 1:
        fewest = min(phases.values())
        minority = [p for p, n in phases.items() if n == fewest]
        odd = [p for p in minority if p != TRAINING_PHASE] or minority
        return sorted(r for r, info in reports.items() if info["phase"] in odd)
    idle = [r for r, info in reports.items() if not _in_collective(info.get("where", ""))]
    return sorted(idle) if 0 < len(idle) < len(reports) else []


class HangWatchdog(threading.Thread):
    """Fires when this rank makes no progress for `timeout` seconds: dumps every thread's stack, swaps
    reports with the other ranks through the c10d store (TCP, independent of NCCL), names the rank
    behind, records the finding, and exits so that torchrun tears the job down."""

    def __init__(self, timeout: float, reporter: Reporter, run_dir: Path):
        super().__init__(name="sftdoctor-watchdog", daemon=True)
        self.timeout, self.reporter, self.run_dir = timeout, reporter, run_dir
        self.rank, self.world = rank_world()
        self.main_thread = threading.main_thread().ident
        self.step, self.phase, self.slack = 0, "starting", 2.0
        self.last = time.monotonic()
        self.done = threading.Event()

    @property
    def poll(self) -> float:
        """How often the watchdog looks; the ranks' reports are awaited for two of these and 5 s more."""
        return max(0.5, min(5.0, self.timeout / 10))

    def beat(self, step: int, phase: str, slack: float = 1.0) -> None:
        self.step, self.phase, self.slack, self.last = step, phase, slack, time.monotonic()

    def stop(self) -> None:
        self.done.set()

    def run(self) -> None:
        # where this rank's process is: the reporting rank reads the state of one that sends nothing (T, D)
        _set(
            _store() if self.world > 1 else None,
            f"{PID_KEY}/{self.rank}",
            json.dumps({"host": socket.gethostname(), "pid": os.getpid()}),
        )
        while not self.done.wait(self.poll):
            stalled = time.monotonic() - self.last
            if stalled > self.timeout * self.slack:
                self.fire(stalled)

    def fire(self, stalled: float) -> None:
        stacks = self.run_dir / "stacks"
        stacks.mkdir(exist_ok=True)
        with open(stacks / f"rank-{self.rank}.txt", "w") as handle:
            faulthandler.dump_traceback(file=handle, all_threads=True)
        dump = self._dump_flight_recorder()  # before the report: a rank that reported has dumped
        mine = {
            "step": self.step,
            "phase": self.phase,
            "stalled_s": round(stalled, 1),
            "where": _where(self.main_thread),
        }
        store = _store()
        asked, reports = store is not None, {self.rank: mine}
        first, store = self._swap_bounded(store, reports, dump) if asked else (True, None)
        reports = dict(reports)
        if first:
            hang = {
                "timeout_s": self.timeout,
                "behind": behind(reports, self.world),
                "world": self.world,
                "ranks": {str(r): info for r, info in reports.items()},
                "stacks": str(stacks),
                "arrived": arrived(self.run_dir, self.world, reports, store),
                "store_answered": store is not None if asked else None,
                "flight_recorder": self._read_dumps(),
            }
            findings = self.reporter.check(hang=hang)
            self.reporter.publish(findings, self.step, force=True)
            if findings and self.reporter.acts("nccl-timeout"):
                self.reporter.stopped(HANG_EXIT, findings[0])
            _set(store, DONE_KEY)
        else:  # a rank that exits ends the job (torchrun stops the rest): wait for the report (seconds at 64 ranks)
            _wait(store, DONE_KEY, REPORT_WAIT_S)
        if not self.reporter.acts("nccl-timeout"):  # silenced: reported once, the run left to NCCL's own timeout
            self.done.set()
            return
        time.sleep(1.0)  # let the other ranks finish their dumps
        os._exit(HANG_EXIT)

    def _swap_bounded(self, store, reports: dict[int, Any], dump: bytes | None) -> tuple[bool, Any]:
        """`_swap` with a deadline: the store's server runs in rank 0's process, and a TCPStore read waits on its
        socket without a timeout (torch 2.13: `set_timeout` bounds waits for keys, not replies). With that process
        frozen (SIGSTOP, D state) the swap never returns: this rank then reports alone, the store taken as gone.
        Returns (whether this rank reports, the store or None)."""
        answer: list[bool] = []
        worker = threading.Thread(target=lambda: answer.append(self._swap(store, reports, dump)), daemon=True)
        worker.start()
        worker.join(2 * self.poll + 5 + SWAP_MARGIN_S)
        return (answer[0], store) if answer else (True, None)

    def _swap(self, store, reports: dict[int, Any], dump: bytes | None) -> bool:
        """Send this rank's stacks, dump and report through the store, collect the others' reports until a short
        deadline; whether this rank is the first done (the one that reports). The store's reads are TCP, not
        NCCL: they answer while a collective is wedged."""
        try:
            # through the store too: the ranks of other nodes write into their own run dir
            store.set(f"{STACKS_KEY}/{self.rank}", (self.run_dir / "stacks" / f"rank-{self.rank}.txt").read_bytes())
            if dump is not None:
                store.set(f"{FR_KEY}/{self.rank}", dump)
            store.set(f"sftdoctor/hang/{self.rank}", json.dumps(reports[self.rank]))
            deadline = time.monotonic() + 2 * self.poll + 5
            while time.monotonic() < deadline and len(reports) < self.world:
                for r in range(self.world):
                    key = f"sftdoctor/hang/{r}"
                    if r not in reports and store.check([key]):
                        reports[r] = json.loads(store.get(key))
                time.sleep(0.2)
            first = store.add("sftdoctor/hang/reported", 1) == 1
            if first:
                self._gather_dumps(store, reports)
            return first
        except Exception:  # the store itself may be gone with rank 0: report what we have
            return True

    def _dump_flight_recorder(self) -> bytes | None:
        """This rank's flight recorder (NCCL's, or the generic one that records Gloo), saved before we abort."""
        try:
            backend = dist.get_backend()
        except Exception:  # no process group: one process, nothing collective to record
            return None
        data = compat.dump_flight_recorder(backend)
        if data is not None:
            folder = self.run_dir / FR_DIR
            folder.mkdir(exist_ok=True)
            (folder / f"rank-{self.rank}").write_bytes(data)  # <prefix><rank>: torch's naming, torchfrtrace reads it
        return data

    def _gather_dumps(self, store, reports: dict[int, Any]) -> None:
        """The stacks and dumps of every rank that sent them, from the store, where this node has none of its own
        (a rank that never reported may still have sent its stacks before it froze)."""
        for r in range(self.world):
            for key, path in (
                (FR_KEY, self.run_dir / FR_DIR / f"rank-{r}"),
                (STACKS_KEY, self.run_dir / "stacks" / f"rank-{r}.txt"),
            ):
                if not path.exists() and store.check([f"{key}/{r}"]):
                    path.parent.mkdir(exist_ok=True)
                    path.write_bytes(store.get(f"{key}/{r}"))

    def _read_dumps(self) -> dict[str, Any] | None:
        """Torch's analyzer over every rank's dump: which collective, which rank stayed out or called another."""
        if not (self.run_dir / FR_DIR).is_dir():
            return None
        return flight_recorder.read(self.run_dir / FR_DIR, self.world, compat.process_groups())


def arrived(run_dir: Path, world: int, reports: dict[int, dict[str, Any]], store=None) -> dict[str, dict[str, Any]]:
    """What came from each rank of the world when the watchdog fired: its progress report, its stacks file, its
    flight-recorder dump (paths, or None). A rank from which nothing came is frozen or gone, the first suspect:
    where its process is (host, pid) and, on this host, its state (T stopped, D blocked in the kernel)."""

    def there(path: Path) -> str | None:
        return str(path) if path.is_file() else None

    said = {
        str(r): {
            "report": r in reports,
            "stacks": there(run_dir / "stacks" / f"rank-{r}.txt"),
            "dump": there(run_dir / FR_DIR / f"rank-{r}"),
        }
        for r in range(world)
    }
    for r, got in said.items():
        if not (got["report"] or got["stacks"] or got["dump"]):
            got["process"] = process_of(store, int(r))
    return said


def process_of(store, rank: int) -> dict[str, Any] | None:
    """The host and pid a rank published when its watchdog started, and its state read from /proc on this host."""
    try:
        if store is None or not store.check([f"{PID_KEY}/{rank}"]):
            return None
        where = json.loads(store.get(f"{PID_KEY}/{rank}"))
    except Exception:  # the store is gone: nothing more is known of that rank
        return None
    if where.get("host") != socket.gethostname():
        return {**where, "state": None}
    return {**where, **proc_state(int(where["pid"]))}


PROC_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "blocked in the kernel (uninterruptible sleep)",
    "T": "stopped (SIGSTOP)",
    "t": "stopped by a debugger",
    "Z": "a zombie (exited, not reaped)",
    "X": "dead",
    "I": "idle",
}


def proc_state(pid: int) -> dict[str, Any]:
    """A process's state letter and meaning (/proc/PID/stat) and the kernel function it waits in (wchan)."""
    try:
        letter = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return {"state": "gone (no such process on this host)"}
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or None
    except OSError:
        wchan = None
    return {"state": f"{letter} ({PROC_STATES.get(letter, 'unknown')})", "wchan": None if wchan == "0" else wchan}


def _store():
    return compat.default_store()


def _set(store, key: str, value: str = "1") -> None:
    try:
        if store is not None:
            store.set(key, value)
    except Exception:  # the store may be gone with rank 0: the others' wait ends at its deadline
        pass


def _wait(store, key: str, seconds: float) -> bool:
    """Whether `key` appeared in the store within `seconds`."""
    deadline = time.monotonic() + seconds
    while store is not None and time.monotonic() < deadline:
        try:
            if store.check([key]):
                return True
        except Exception:  # the store is gone: nobody is left to wait for
            return False
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------- the callback


class Guard(TrainerCallback):
    """Installed on the trainer by the recipe. See the module docstring for what it costs."""

    def __init__(self, trainer, plan: Plan, run_dir: Path):
        self.trainer, self.plan, self.run_dir = trainer, plan, run_dir
        self.reporter = Reporter(run_dir, plan.plugins, plan.silenced)
        self.grad_norm = None
        self.last_finite: dict[str, float | None] = {"loss": None, "grad_norm": None}
        self.skips = 0
        self.skip_next = False
        self.losses: collections.deque = collections.deque(maxlen=50)
        self.quiet_since: dict[str, int] = {}  # check id -> step of its last published finding
        self.overflows: collections.deque = collections.deque(maxlen=100)
        self.watchdog = HangWatchdog(plan.hang_timeout_s, self.reporter, run_dir)
        compat.wrap_grad_norm(trainer, self._capture)  # once per optimizer step, before clipping

    def _capture(self, norm) -> None:
        self.grad_norm = norm

    # -- lifecycle
    def on_train_begin(self, args, state, control, **kwargs):
        skips = self.plan.on_nan == "skip" or not self.reporter.acts("nan-loss")
        if skips and not self.plan.deepspeed and self.plan.precision != "fp16":
            optimizer = self.trainer.optimizer
            step = optimizer.step

            @functools.wraps(step)  # keeps the LR scheduler's marker on the wrapped step
            def maybe_step(*a, **k):
                if self.skip_next:  # drop the poisoned update; the trainer zeroes the gradients next
                    self.skip_next = False
                    return None
                return step(*a, **k)

            optimizer.step = maybe_step
        self.watchdog.beat(state.global_step, "first step", slack=2.0)
        self.watchdog.start()

    def on_train_end(self, args, state, control, **kwargs):
        self.watchdog.stop()

    def on_step_begin(self, args, state, control, **kwargs):
        self.watchdog.beat(state.global_step + 1, TRAINING_PHASE)

    def on_substep_end(self, args, state, control, **kwargs):
        self.watchdog.beat(state.global_step + 1, TRAINING_PHASE)

    def on_prediction_step(self, args, state, control, **kwargs):
        self.watchdog.beat(state.global_step, "evaluating")

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:
            self.watchdog.beat(state.global_step, "saving a checkpoint", slack=4.0)
        elif control.should_evaluate:
            self.watchdog.beat(state.global_step, "evaluating")
        else:
            self.watchdog.beat(state.global_step, "between steps")
        if self.plan.precision == "fp16":
            self.overflows.append(compat.optimizer_step_was_skipped(self.trainer))

    # -- non-finite losses
    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        norm = self.grad_norm
        value = float(norm) if norm is not None else None  # the one scalar read per optimizer step
        if value is None or math.isfinite(value):
            self.last_finite["grad_norm"] = value
            return
        bad_ranks = self._ranks_with_bad_loss()  # one small collective, only on this rare path
        if self.plan.precision == "fp16" and not bad_ranks:
            return  # an fp16 overflow: the loss scaler skips this step and lowers the scale (normal)
        self._non_finite(state, value, bad_ranks)

    def _ranks_with_bad_loss(self) -> list[int]:
        """Only when stopping or skipping: which ranks' loss was non-finite (one small all_gather)."""
        loss = getattr(self.trainer, "sftdoctor_last_loss", None)
        bad = torch.tensor([0.0 if loss is None or bool(torch.isfinite(loss).all()) else 1.0])
        rank, world = rank_world()
        if world == 1 or not dist.is_initialized():
            return [rank] if bad.item() else []
        if dist.get_backend() == "nccl":
            bad = bad.cuda()
        flags = [torch.zeros_like(bad) for _ in range(world)]
        dist.all_gather(flags, bad)
        return [r for r, flag in enumerate(flags) if flag.item()]

    def _non_finite(self, state, value: float, bad_ranks: list[int]) -> None:
        step = state.global_step + 1
        # nan-loss silenced: the user accepts non-finite steps; each is still dropped (as on_nan = "skip"), never
        # counted against max_skips, and the run goes on
        accepted = not self.reporter.acts("nan-loss")
        stopping = not accepted and (self.plan.on_nan == "stop" or self.skips >= self.plan.max_skips)
        # Under DeepSpeed the engine has already stepped inside backward (accelerate) and skipped the update
        # itself (DeepSpeed 0.19: non-finite gradient norm -> "OVERFLOW! Skipping step"); under fp16 AMP the
        # loss scaler skips it. Only bf16/fp32 without DeepSpeed need our skip.
        skipped_by = (
            "DeepSpeed" if self.plan.deepspeed else "the fp16 loss scaler" if self.plan.precision == "fp16" else None
        )
        stats = {
            "step": step,
            "finite": False,
            "grad_norm": value,
            "loss_finite": not bad_ranks,
            "ranks": ", ".join(map(str, bad_ranks)) if bad_ranks else "all (the gradients)",
            "last_finite": dict(self.last_finite),
            "lr": self.trainer.lr_scheduler.get_last_lr()[0],
            "precision": self.plan.precision,
            "checkpoint": str(newest_complete(self.run_dir) or "") or None,
            "action": "stopped; no checkpoint of these weights is written"
            if stopping
            else "update skipped"
            + ("" if accepted else f" ({self.skips + 1} of at most {self.plan.max_skips})")
            + (f" by {skipped_by}" if skipped_by else "")
            + ("; nan-loss silenced: the run goes on" if accepted else ""),
        }
        if stopping:
            self.watchdog.beat(step, "attributing a non-finite loss", slack=4.0)
            inputs = getattr(self.trainer, "sftdoctor_last_inputs", None)
            if inputs is not None:
                stats["attribution"] = f"Rank {rank_world()[0]}'s last micro-batch: " + attribute(
                    self.trainer.model, inputs
                )
            stats["rows"] = self._trace_rows()
        findings = self.reporter.check(step_stats=stats)
        self.reporter.publish(findings, step)
        if stopping:
            cause = next((f for f in findings if f.id == "nan-loss"), findings[0])
            if rank_world()[0] == 0:
                self.reporter.stopped(NAN_EXIT, cause)
            self.watchdog.stop()
            raise RunStopped(NAN_EXIT, cause)
        self.skips += 1
        self.skip_next = skipped_by is None

    def _trace_rows(self) -> dict[str, Any] | None:
        """The step's rows on every rank and the fp32 re-runs' verdict (train.rows): each rank traces its own,
        rank 0 gathers them through the c10d store (not a collective: the ranks' re-runs take unequal times)."""
        rank, world = rank_world()
        zero3 = ((self.plan.deepspeed or {}).get("zero_optimization") or {}).get("stage") == 3
        no_rerun = (
            "ZeRO-3 gathers the weights collectively"
            if zero3
            else "FSDP gathers each layer's weights collectively"
            if self.plan.fsdp is not None
            else None
        )
        try:
            mine = rows.trace(
                self.trainer,
                getattr(self.trainer, "sftdoctor_step_inputs", []),
                self.plan.train_files,
                self.trainer.sftdoctor_raw_rows,
                backward=not self.plan.deepspeed,
                no_rerun=no_rerun,
            )
        except Exception as exc:  # the trace must never hide the finding it explains
            mine = {"micro_batches": [], "fp32": False, "why_not_fp32": f"tracing failed: {type(exc).__name__}: {exc}"}
        traces = {str(rank): mine}
        store = _store() if world > 1 else None
        if store is not None:
            _set(store, f"{ROWS_KEY}/{rank}", json.dumps(mine))
            if rank != 0:
                return None  # rank 0 reports
            for r in range(1, world):
                if _wait(store, f"{ROWS_KEY}/{r}", rows.ROW_TIMEOUT_S):
                    traces[str(r)] = json.loads(store.get(f"{ROWS_KEY}/{r}"))
        return {"ranks": traces, **rows.verdict(traces, self.plan.precision)}

    # -- logged values
    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        loss = float(logs["loss"])
        if math.isfinite(loss):
            self.last_finite["loss"] = loss
            findings = self.reporter.check(
                log_stats={
                    "step": state.global_step,
                    "loss": loss,
                    "history": list(self.losses),
                    "factor": self.plan.loss_spike_factor,
                    "grad_norm": logs.get("grad_norm"),
                    "lr": logs.get("learning_rate"),
                }
            )
            self._publish(findings, state.global_step, "loss-spike")
            self.losses.append(loss)
        if self.plan.precision == "fp16":
            min_scale = ((self.plan.deepspeed or {}).get("fp16") or {}).get("min_loss_scale", 1.0)
            findings = self.reporter.check(
                scale_stats={
                    "step": state.global_step,
                    "scale": compat.loss_scale(self.trainer),
                    "skipped": sum(self.overflows),
                    "window": len(self.overflows),
                    "min_scale": float(min_scale),
                }
            )
            self._publish(findings, state.global_step, "fp16-loss-scale")

    def _publish(self, findings: list[Finding], step: int, quiet_id: str) -> None:
        """One divergence or one stuck scale is one event: `quiet_id`'s findings wait SPIKE_QUIET steps after
        the last one; every other check's findings (third-party ones included) are published as they come."""
        last = self.quiet_since.get(quiet_id, -SPIKE_QUIET)
        quiet = [f.id.partition("/")[0] == quiet_id for f in findings]  # any of the check's messages (`id/slug`)
        loud = [(f, hush) for f, hush in zip(findings, quiet) if not hush or step - last >= SPIKE_QUIET]
        if any(hush for _, hush in loud):
            self.quiet_since[quiet_id] = step
        self.reporter.publish([f for f, _ in loud], step)


# ---------------------------------------------------------------- drills


def poison_sequence(model, tokens: torch.Tensor) -> None:
    """The nan-row drill: wherever these exact tokens are fed to the model (in the step, in a packed row, in a
    re-run alone), their input embeddings become inf: a row that makes any step it is in non-finite, in any
    precision, as a row with a broken embedding would."""
    tokens = tokens.detach().clone()
    n = len(tokens)

    def poisoned(module, args, output):
        ids = args[0] if args else None
        if ids is None or ids.shape[-1] < n:
            return output
        windows = ids.unfold(-1, n, 1)  # [batch, starts, n]
        starts = (windows == tokens.to(ids.device)).all(-1)
        if not starts.any():
            return output
        hit = torch.zeros_like(ids, dtype=torch.bool)
        for b, s in starts.nonzero().tolist():
            hit[b, s : s + n] = True
        return output.masked_fill(hit[..., None], float("inf"))

    model.get_input_embeddings().register_forward_hook(poisoned)


class HangDrill(TrainerCallback):
    """At that step, that rank (hang) blocks inside a collective of its own group that the other ranks never
    join, or (desync) calls a broadcast on the default group where the others all-reduce their gradients."""

    def __init__(self, drill: dict[str, Any], watchdog: HangWatchdog):
        self.drill, self.watchdog = drill, watchdog
        distributed = dist.is_available() and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if distributed and drill["kind"] == "hang" else None

    def on_step_begin(self, args, state, control, **kwargs):
        rank, world = rank_world()
        if state.global_step + 1 != self.drill["step"] or rank != (self.drill["rank"] or 0):
            return
        if self.drill["kind"] == "desync":  # the source is another rank, which is in its own collective: both wait
            self.watchdog.beat(state.global_step + 1, "drill: in a broadcast the other ranks do not call")
            # 4 MiB: Gloo aborts a rank that receives more bytes than its collective expects (its own mismatch
            # check, "op.preamble.length <= op.nbytes"), NCCL does not; room for any peer's message keeps the
            # drill a hang on both
            dist.broadcast(torch.zeros(2**20), src=(rank + 1) % world)
            return
        self.watchdog.beat(state.global_step + 1, "drill: blocked in an all_reduce the other ranks never join")
        if self.group is None:
            threading.Event().wait()  # one process: just block
        dist.all_reduce(torch.zeros(1), group=self.group)
