"""The space narrowed by the plan before anything is sampled: a choice that cannot fit the GPUs with any setting
of the other keys is dropped.

Each point of the space's corners (every choice, and both ends of each range) is resolved into the Plan
`sftdoctor train` would follow on this machine (or on the recorded one of `--facts`) and sized by the one
memory model (`run.resolve.memory_fit`, the memory-fit check's). A value of a choice is dropped when no point
with it fits; a range is never cut (the gate prunes what in it does not fit). Without GPUs of known memory,
or when the space changes the model itself, nothing is narrowed, and the line says why.
"""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sftdoctor.sweep.config import Dim, Sweep, dumps, show

MAX_POINTS = 4096
MODEL_KEYS = {"model.path", "model.weights", "model.trust_remote_code"}  # the shape is the base model's


@dataclass
class Narrowed:
    space: tuple[Dim, ...]
    note: str  # one line: what was dropped and for which GPUs, or why nothing was narrowed
    dropped: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # name -> [{value, peak_gib}]
    fits: bool = True  # False: no point of the space fits
    smallest_gib: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"note": self.note, "dropped": self.dropped}


def not_narrowed(sweep: Sweep, why: str) -> Narrowed:
    return Narrowed(sweep.space, f"not narrowed: {why}")


def narrow(sweep: Sweep, facts_file: Path | None = None) -> Narrowed:
    if not sweep.narrow:
        return not_narrowed(sweep, "narrow = false")
    if not any(d.kind == "choices" for d in sweep.space):
        return not_narrowed(sweep, "no key of the space has choices")
    if changed := sorted(MODEL_KEYS & {d.name for d in sweep.space}):
        return not_narrowed(sweep, f"the space changes the model ({', '.join(changed)})")
    count = 1
    for d in sweep.space:
        count *= len(d.candidates())
    if count > MAX_POINTS:
        return not_narrowed(sweep, f"{count} corner points, more than {MAX_POINTS} to size")
    with tempfile.TemporaryDirectory(prefix="sftdoctor-narrow-") as folder:
        return _narrow(sweep, facts_file, Path(folder))


def _narrow(sweep: Sweep, facts_file: Path | None, folder: Path) -> Narrowed:
    from sftdoctor.facts import Facts, Inputs
    from sftdoctor.run.gpus import describe_gpus, devices, smallest_memory
    from sftdoctor.run.shape import Shape

    first = {d.name: d.candidates()[0] for d in sweep.space}
    config = folder / "run.toml"
    config.write_text(dumps(sweep.trial_raw(first, folder / "run")), encoding="utf-8")
    facts = Facts(Inputs(config=config, facts=facts_file))
    gpus = facts.get("gpus")
    memory = smallest_memory(gpus)
    if not devices(gpus) or not memory:
        return not_narrowed(
            sweep, "no GPU of known memory here" + ("" if facts_file else " (--facts FILE judges another machine's)")
        )
    shape_fact = facts.get("model_shape")
    if not shape_fact or "error" in shape_fact:
        return not_narrowed(
            sweep, f"the model's size is unknown: {(shape_fact or {}).get('error') or facts.why_missing('model_shape')}"
        )
    sized = _sized(sweep, facts, config, folder, Shape(**shape_fact), memory)
    where = f"{describe_gpus(devices(gpus))}, {memory / 2**30:.1f} GiB"
    if not sized:
        return not_narrowed(sweep, "no corner of the space is a valid run config")
    smallest = min(peak for _, _, peak in sized) / 2**30
    if not any(fits for _, fits, _ in sized):
        return Narrowed(
            sweep.space,
            f"nothing in the space fits {where}: the smallest predicted peak is {smallest:.1f} GiB per GPU",
            fits=False,
            smallest_gib=smallest,
        )
    space, dropped = _drop(sweep, sized)
    if not dropped:
        return Narrowed(tuple(space), f"every choice fits {where} with some setting of the others")
    said = "; ".join(
        f"{name} = {', '.join(show(x['value']) for x in xs)} (at least "
        f"{min(x['peak_gib'] for x in xs):.1f} GiB per GPU)"
        for name, xs in dropped.items()
    )
    return Narrowed(tuple(space), f"narrowed for {where}: dropped {said}", dropped)


def _sized(
    sweep: Sweep, facts, config: Path, folder: Path, shape, memory: int
) -> list[tuple[dict[str, Any], bool, int]]:
    """Each corner of the space the run config takes: its values, whether it fits and its predicted peak."""
    from sftdoctor.errors import InputErrors
    from sftdoctor.facts import Overlay
    from sftdoctor.run import decide, validate
    from sftdoctor.run.resolve import memory_fit

    names = [d.name for d in sweep.space]
    sized = []
    for values in itertools.product(*(d.candidates() for d in sweep.space)):
        params = dict(zip(names, values))
        try:
            run = validate(sweep.trial_raw(params, folder / "run"), config)
        except InputErrors:  # a combination the run config refuses: its trial is pruned by that, not sized
            continue
        plan = decide(run, Overlay(facts, run=run))
        current = memory_fit(plan, shape, memory).current
        sized.append((params, current.fits, current.estimate.gpu_peak))
    return sized


def _drop(sweep: Sweep, sized: list[tuple[dict[str, Any], bool, int]]) -> tuple[list, dict[str, list[dict]]]:
    """The space without the choices that fit with no setting of the others, and those dropped, with their
    smallest peak."""
    space, dropped = [], {}
    for d in sweep.space:
        if d.kind != "choices":
            space.append(d)
            continue
        kept = []
        for value in d.choices:
            with_it = [(fits, peak) for params, fits, peak in sized if params[d.name] == value]
            if not with_it or any(fits for fits, _ in with_it):
                kept.append(value)
            else:
                peak = min(p for _, p in with_it) / 2**30
                dropped.setdefault(d.name, []).append({"value": value, "peak_gib": round(peak, 2)})
        space.append(d.with_choices(tuple(kept)))
    return space, dropped
