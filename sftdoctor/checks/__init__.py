"""The check registry: declaring, loading and running checks.

A check is a plain function of facts, declared with `@check`, which only attaches metadata
(importing a module changes no global state). Facts are injected by parameter name: a
parameter with a default is optional; a required fact that is unavailable skips the check
with the reason. A check that raises becomes an error finding naming it; the rest still run.
Third-party checks register through the entry-point group "sftdoctor.checks" (an entry
point names a module, or a single check function); every command loads them the same way, and
`--no-plugins` or SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1 (as pytest's PYTEST_DISABLE_PLUGIN_AUTOLOAD)
turns them off. The same runner serves `check`, the gate of `train`, `check --distributed` and the
runtime watchers.

A check that says several different things declares each as a message (`messages={"shm": "..."}`), whose
findings carry the id CHECK/slug, so that a user can silence one (`--disable`, `[checks] disable`). A built-in
check that asks for a fact that does not exist, or one of another phase, is refused when its module is imported
(CheckDeclarationError, as pluggy refuses a hook that does not match its spec): its tests fail. A plugin's is
refused when loaded, as a `plugin-load` warning, and `check --list` and `--select` say why.
"""

from __future__ import annotations

import importlib
import os
import re
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from sftdoctor.errors import InputError, InputErrors, did_you_mean
from sftdoctor.facts.catalogue import PHASES, unavailable_to
from sftdoctor.findings import Finding, Severity

ENTRY_POINT_GROUP = "sftdoctor.checks"
# Every module of this package is scanned for checks (a new one needs no registration). This only orders the
# output table, the checks a practitioner reads first at the top; a module not named here comes after these.
SHOWN_FIRST = (
    "torch_cuda",
    "precision",
    "topology",
    "deepspeed",
    "flash_attn",
    "advisories",
    "nccl_env",
    "run_config",
    "memory",
    "packing",
    "targets",
    "embeddings",
    "lora",
    "evaluation",
    "contamination",
    "runtime",
    "curves",
    "cluster",
)
_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class CheckSpec:
    id: str
    summary: str
    explain: str
    phase: str
    func: Callable[..., Any]
    origin: str = "sftdoctor"
    messages: dict[str, str] = field(default_factory=dict)  # sub-id slug -> what that message says

    @property
    def ids(self) -> set[str]:
        """The ids its findings may carry: its own and CHECK/slug for each declared message."""
        return {self.id, *(f"{self.id}/{slug}" for slug in self.messages)}

    @property
    def facts(self) -> list[tuple[str, bool]]:
        """(fact name, required) for each parameter; one with a default is optional.
        Read from the code object: inspect.signature costs the CLI's start-up 10 ms."""
        func = self.func
        while hasattr(func, "__wrapped__"):  # a plugin's check behind functools.wraps
            func = func.__wrapped__
        code = func.__code__
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        optional = set(names[code.co_argcount - len(func.__defaults__ or ()) : code.co_argcount])
        optional |= set(func.__kwdefaults__ or {})
        return [(name, name not in optional) for name in names]

    def refusal(self) -> str | None:
        """Why it can never run as declared (a fact that does not exist, or one of another phase), or None."""
        return next((why for why in (unavailable_to(name, self.phase) for name, _ in self.facts) if why), None)


class CheckDeclarationError(Exception):
    """A built-in check declared wrong (a fact it can never receive, a message id that is not kebab-case): raised
    when its module is imported, so that its tests fail, not a user's run."""


def check(
    id: str, summary: str, explain: str | None = None, phase: str = "preflight", messages: dict[str, str] | None = None
):
    """Declare a check. `explain` is its kb topic (default: the id); `messages` its sub-ids (`id/slug`), one each."""
    if not _ID.fullmatch(id):
        raise ValueError(f"check id {id!r} must be kebab-case")
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}")
    for slug, said in (messages or {}).items():
        if not isinstance(slug, str) or not _ID.fullmatch(slug) or not isinstance(said, str) or not said.strip():
            raise CheckDeclarationError(
                f"check {id!r}: message {slug!r}: expected a kebab-case slug and a line saying what it reports"
            )

    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
        spec = CheckSpec(id, summary, explain or id, phase, func, messages=dict(messages or {}))
        why = spec.refusal() if (func.__module__ or "").startswith("sftdoctor.") else None
        if why:  # built in: refused here, at import; a plugin's is refused softly when loaded (Registry.add)
            raise CheckDeclarationError(f"check {id!r} ({func.__module__}.{func.__qualname__}) {why}")
        func.__sftdoctor_check__ = spec
        return func

    return mark


@dataclass(frozen=True)
class Refused:
    """A plugin's check that was not loaded, and why: `check --list` shows it, `--select` says why."""

    spec: CheckSpec
    why: str


def plugin_problem(message: str, fix: str) -> Finding:
    """A `plugin-load` warning: a plugin's check that was not loaded, and what to do about it."""
    return Finding(Severity.WARNING, message, fix=fix, id="plugin-load", explain="plugins")


@dataclass
class Registry:
    checks: dict[str, CheckSpec] = field(default_factory=dict)
    problems: list[Finding] = field(default_factory=list)  # plugins that failed to load
    refused: dict[str, Refused] = field(default_factory=dict)

    def add(self, spec: CheckSpec) -> None:
        wrong = spec.refusal()
        if wrong:  # it would be skipped on every run, or never be called: refused here, where it is seen
            self.refused.setdefault(spec.id, Refused(spec, f"it {wrong}"))
            self.problems.append(
                plugin_problem(
                    f"check {spec.id!r} from {spec.origin} not loaded: it {wrong}",
                    f"name a fact of the {spec.phase} phase (`sftdoctor explain plugins` lists them)",
                )
            )
            return
        if spec.id in self.checks:
            first = self.checks[spec.id].origin
            self.problems.append(
                plugin_problem(
                    f"check {spec.id!r} from {spec.origin} ignored: {first} already defines it",
                    f"rename the check in {spec.origin}",
                )
            )
            return
        self.checks[spec.id] = spec

    def scan(self, obj: ModuleType | Callable[..., Any], origin: str) -> None:
        members = vars(obj).values() if isinstance(obj, ModuleType) else [obj]
        for member in members:
            spec = getattr(member, "__sftdoctor_check__", None)
            if isinstance(spec, CheckSpec):
                self.add(replace(spec, origin=origin))

    def select(self, ids: Iterable[str]) -> list[CheckSpec]:
        return [self.checks[i] for i in ids]

    def unknown(self, ids: Iterable[str]) -> list[str]:
        return [i for i in ids if i not in self.checks]

    def message_ids(self) -> list[str]:
        """Every id a user may name: each check's, each of its messages', and each refused check's."""
        return [*(i for spec in self.checks.values() for i in sorted(spec.ids)), *self.refused]

    def not_a_check(self, name: str) -> str:
        """What to say of --select NAME that names no check: refused (and why), or unknown with a did-you-mean."""
        if name in self.refused:
            refused = self.refused[name]
            return f"check {name!r} from {refused.spec.origin} was refused: {refused.why}"
        return f"no check {name!r}{did_you_mean(name, self.checks)}; see `sftdoctor check --list`"

    def phase(self, phase: str) -> list[CheckSpec]:
        return [spec for spec in self.checks.values() if spec.phase == phase]


PLUGINS_OFF = "SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD"


def plugins_enabled(no_plugins: bool = False) -> bool:
    """Third-party checks load unless --no-plugins or SFTDOCTOR_DISABLE_PLUGIN_AUTOLOAD is set (not "" or "0")."""
    return not no_plugins and os.environ.get(PLUGINS_OFF, "") in ("", "0")


def builtin_modules() -> list[str]:
    """The modules of sftdoctor.checks, in the order their checks are shown."""
    import pkgutil

    found = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    rank = {name: i for i, name in enumerate(SHOWN_FIRST)}
    return [f"{__name__}.{name}" for name in sorted(found, key=lambda n: (rank.get(n, len(rank)), n))]


def load_checks(plugins: bool = True) -> Registry:
    registry = Registry()
    for name in builtin_modules():
        registry.scan(importlib.import_module(name), "sftdoctor")
    if plugins:
        from sftdoctor.facts.distributions import entry_points, load_entry_point

        for name, value, _dist in entry_points(ENTRY_POINT_GROUP):
            origin = f"plugin {name} ({value})"
            try:
                registry.scan(load_entry_point(value), origin)
            except Exception as exc:  # a broken plugin must not take the suite down
                registry.problems.append(
                    plugin_problem(
                        f"{origin} failed to load: {type(exc).__name__}: {exc}",
                        "fix or uninstall the plugin, or run with --no-plugins",
                    )
                )
    return registry


class NotApplicable(Exception):
    """Raised by a check whose facts are present but say it does not apply (one GPU, no GPU)."""


@dataclass(frozen=True)
class Skipped:
    id: str
    reason: str


def run_check(spec: CheckSpec, facts) -> list[Finding] | Skipped:
    """One check in isolation: its whole result (a Finding, a list, or a generator of them) is materialised
    and type-checked here, so whatever goes wrong inside it becomes one error finding naming it."""
    kwargs: dict[str, Any] = {}
    for name, required in spec.facts:
        value = facts.get(name) if facts.known(name) else None
        if value is not None:
            kwargs[name] = value
        elif required:
            return Skipped(spec.id, facts.why_missing(name) or f"needs the fact {name!r}")
    try:
        result = spec.func(**kwargs)
        findings = [result] if isinstance(result, Finding) else list(result or [])
    except NotApplicable as exc:
        return Skipped(spec.id, str(exc))
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return [
            _broken(
                spec, f"crashed: {type(exc).__name__}: {exc}", f"at {where.filename}:{where.lineno} ({spec.origin})"
            )
        ]
    wrong = [f for f in findings if not isinstance(f, Finding)]
    if wrong:
        return [
            _broken(
                spec,
                f"returned {type(wrong[0]).__name__} {str(wrong[0])[:80]!r}, not a Finding",
                f"{spec.func.__module__}.{spec.func.__qualname__} ({spec.origin})",
            )
        ]
    undeclared = next((f.id for f in findings if f.id and f.id not in spec.ids), None)
    if undeclared and spec.origin == "sftdoctor":  # a built-in message must be declared: it can be silenced
        return [
            _broken(
                spec,
                f"returned a finding of id {undeclared!r}, which it does not declare (@check messages=)",
                f"{spec.func.__module__}.{spec.func.__qualname__} ({spec.origin})",
            )
        ]
    return [replace(f, id=f.id or spec.id, explain=f.explain or spec.explain) for f in findings]


def _broken(spec: CheckSpec, what: str, where: str) -> Finding:
    return Finding(
        Severity.ERROR,
        f"check {spec.id} {what}",
        detail=where,
        fix="report this with `sftdoctor facts` output attached; the other checks still ran",
        id=spec.id,
        explain=spec.explain,
    )


def run_checks(specs: Iterable[CheckSpec], facts) -> tuple[list[Finding], list[Skipped]]:
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    for spec in specs:
        outcome = run_check(spec, facts)
        if isinstance(outcome, Skipped):
            skipped.append(outcome)
        else:
            findings.extend(outcome)
    return findings, skipped


def split_ids(values: Iterable[str]) -> list[str]:
    """Ids from a repeatable, comma-separated option (`--disable a,b --disable c`), blanks dropped."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def known_ids(registry: Registry, ids: Iterable[str], source: str, key: str | None = None) -> tuple[str, ...]:
    """The ids to silence or select, each a check's or one of its messages'; an unknown one is bad input naming
    `source` (the option, or the run config and its `key`), with a did-you-mean."""
    ids, known = list(dict.fromkeys(ids)), registry.message_ids()
    errors = [
        InputError(
            source,
            f"no check or message {name!r}{did_you_mean(name, known)}; see `sftdoctor check --list`",
            key=key,
        )
        for name in ids
        if name not in known
    ]
    if errors:
        raise InputErrors(errors)
    return tuple(ids)


def silenced_by(id: str, ids: Iterable[str]) -> bool:
    """Whether a finding of this id (CHECK or CHECK/slug) is silenced by `ids`: its own id or its check's is in
    them. The one rule of `check`, `train`'s gate and its runtime watchers."""
    return bool({id, id.partition("/")[0]} & set(ids))


def silence(findings: list[Finding], ids: Iterable[str]) -> list[Finding]:
    """Each finding whose id, or whose check's id, is in `ids` marked silenced: still shown, never counted."""
    off = set(ids)
    return [replace(f, silenced=True) if silenced_by(f.id, off) else f for f in findings]


def to_silence(registry: Registry, option: Iterable[str] = (), facts=None) -> tuple[str, ...]:
    """The ids `check` and `train`'s gate silence alike: --disable's, then the run config's [checks] disable (a
    plain `check`, without --config, never asks for the run config: its probe imports the run model)."""
    option = tuple(option)
    if any(not split_ids([value]) for value in option):  # `--disable "$UNSET"`: a mistake, not "nothing"
        raise InputError("--disable", "expected check or message ids separated by commas; see `sftdoctor check --list`")
    ids = known_ids(registry, split_ids(option), "--disable")
    run = facts.get("run") if facts is not None and facts.inputs.config is not None else None
    if run is not None:
        ids += known_ids(registry, run.checks.disable, run.path, key="[checks].disable")
    return tuple(dict.fromkeys(ids))
