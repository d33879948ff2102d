"""The loss, the gradient norm and the step in a line of any trainer's log, however it prints them.

Written from the trainers' logging code, not from samples (docs/triage.md lists each format and where it
comes from): a key that names a loss or a gradient norm, a separator, a number-like value.

    Hugging Face Trainer   {'loss': nan, 'grad_norm': inf, ...}        (4.x floats; 5.x strings: 'nan')
    Megatron-LM/-DeepSpeed  iteration  100/ 1000 | ... | lm loss: NAN | grad norm: nan |   ({:.6E} gives NAN)
    nanoGPT                 iter 100: loss nan, time 52.3ms             step 1000: train loss nan, val loss nan
    litgpt                  Epoch 1 | iter 10 step 5 | loss train: nan, val: n/a
    Lightning / tqdm        12/500 [00:10<01:15, 5.80it/s, loss=nan, v_num=0]   (Lightning 2.x: train_loss=nan.0)
    torchtune               1|25|Loss: nan:  ...
    mmengine (xtuner)       Epoch(train) [1][240/735]  lr: 1.9e-04 ... loss: 2.51  grad_norm: nan
    fairseq                 {"epoch": 73, "train_loss": "nan", ..., "train_gnorm": "nan", "train_num_updates": "9291"}
    verl, DeepSpeed-Chat    step:2 - train/loss:nan - train/grad_norm:0.0     epoch: 0|step: 3184|act_loss: inf|
    plain prints            loss = nan, loss: tensor(nan, device='cuda:0'), loss is nan, Batch 7/100 loss nan
                            (CosyVoice's "Batch 7/100" is epoch 7, batch 100: a "N/M" without a bar is no step)

Python prints a float NaN as `nan` (`NAN` with `E` formats, `NaN` in JSON, `np.float64(nan)` for a numpy 2
scalar in a dict), an infinity as `inf`/`-inf` (`Infinity` in JSON); Lightning 2.x's bar pads them to five
characters (`nan.0`, `-inf.`). A key holding "scale" (Megatron's `loss scale`, fairseq's `loss_scale`) is the fp16
loss scale, not a loss.
"""

from __future__ import annotations

import re
from typing import NamedTuple

NON_FINITE = {"nan", "-nan", "+nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity"}

# A word that may name which loss: "lm loss", "train loss", "Val Loss" (not "with loss", "the loss").
_QUALIFIER = (
    r"(?:(?:lm|train|training|val|valid|validation|eval|test|total|avg|mean|batch|running|smoothed|ce|nll|aux)\s)?"
)
_KEY_VALUE = re.compile(
    rf"""(?<![\w.])(?P<key>{_QUALIFIER}(?:[A-Za-z_][\w/.\[\]-]*?)?loss[\w/.-]*(?:\s(?:train|val|valid|eval|avg|mean)\b)?
         |(?:[A-Za-z_][\w/.-]*?)?(?:grad[\s_-]?norm|gnorm)[\w/.-]*)
         ['"]?\s*(?:[:=]\s*|\s+(?:is\s+|was\s+)?)['"]?(?:tensor\(\[?|np\.float\d+\()?
         (?P<value>-inf\.(?!\d)|[-+]?(?:(?:nan|inf(?:inity)?)(?:\.0)?|\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))(?!\w|\.\d)""",
    re.IGNORECASE | re.VERBOSE,
)

# Where a line says which step it is at, most specific first.
_STEPS = (
    ("step", re.compile(r"\b(?:global[_ ]?)?step\b['\"]?\s*[:=#]?\s*['\"]?(\d+)", re.IGNORECASE)),
    ("iteration", re.compile(r"\biteration\s*[:=#]?\s*(\d+)", re.IGNORECASE)),
    ("update", re.compile(r"num_updates['\"]?\s*[:=]\s*['\"]?(\d+)")),
    ("iter", re.compile(r"\biter\s*[:=#]?\s*(\d+)", re.IGNORECASE)),
    ("step", re.compile(r"\]\s*\[(\d+)/\d+\]")),  # mmengine: Epoch(train) [1][240/735]
    ("step", re.compile(r"^\|?\s*\d+\|(\d+)\|")),  # torchtune's bar: EPOCH|STEP|Loss: ...
    ("step", re.compile(r"(?:^|\s)(\d+)/\d+\s*\[")),  # tqdm: 60/500 [00:10<01:15
)


class Value(NamedTuple):
    kind: str  # "loss" or "grad_norm"
    key: str  # as the log names it: "lm loss", "train/grad_norm"
    value: str
    start: int  # where the key starts in the text


def values(text: str) -> list[Value]:
    """Every loss and gradient-norm value in `text`, in order."""
    found = []
    for match in _KEY_VALUE.finditer(text):
        key = match["key"].strip("'\"[]")
        if "scale" in key.lower():
            continue
        kind = "loss" if "loss" in key.lower() else "grad_norm"
        found.append(Value(kind, key, match["value"], match.start("key")))
    return found


def non_finite(value: str | None) -> bool:
    """nan, NAN, -inf, Infinity; Lightning 2.x pads them to 5 characters (`nan.0`, `-inf.`)."""
    return value is not None and re.sub(r"\.0?$", "", value.lower()) in NON_FINITE


def fields(text: str) -> dict[str, str]:
    """{"loss": ..., "loss_key": ..., "grad_norm": ..., "grad_norm_key": ...}: of each kind the first non-finite
    value, else the first value."""
    out: dict[str, str] = {}
    for found in values(text):
        if found.kind not in out or (non_finite(found.value) and not non_finite(out[found.kind])):
            out[found.kind], out[f"{found.kind}_key"] = found.value, found.key
    return out


def step(text: str) -> tuple[str, int] | None:
    """("iteration", 5426): the step a line says it is at, with the word the log uses for it."""
    for label, pattern in _STEPS:
        if match := pattern.search(text):
            return label, int(match.group(1))
    return None


# Megatron-LM / Megatron-DeepSpeed iteration lines (megatron/training/training.py, training_log): the
# average of each loss is printed only `if avg > 0.0`, so a NaN average (or an interval whose iterations
# were all skipped) drops the field from the line; the counters are per logging interval.
_MEGATRON_FIELD = re.compile(r"\|?\s*([A-Za-z][^:|]*?)\s*:\s*([^|]*?)\s*(?=\||$)")
_MEGATRON_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+")


def megatron(text: str) -> dict[str, str] | None:
    """A Megatron iteration line's fields ({"iteration": "9", "lm loss": "2.5E+00", ...}), else None."""
    if not (at := _MEGATRON_ITERATION.search(text)):
        return None
    fields = ((" ".join(key.split()), value) for key, value in _MEGATRON_FIELD.findall(text[at.end() :]))
    return {"iteration": at.group(1), **dict(fields)}


_COUNTERS = ("number of skipped iterations", "number of nan iterations")


def entry(line: str, after: list[str]) -> list[str]:
    """The line and those of `after` that go on with it (a paste wrapped it): up to the first line that starts
    a record of its own or names a step."""
    lines = [line]
    for text in after:
        if starts_entry(text) or step(text) is not None:
            break
        lines.append(text)
    return lines


def counter_only(text: str) -> bool:
    """A line that names a step but no loss and starts no record: the rest of a progress bar (torchtune's
    `|Loss: nan:  0%|` wrapped before its `| 3/3073 [00:15<...]`)."""
    return step(text) is not None and not values(text) and not starts_entry(text.lstrip("| "))


def joins(lines: list[str]) -> tuple[str, ...]:
    """A wrapped entry put back together: at a space (a paste wrapped between words), or with nothing between
    (a terminal cut it at its width)."""
    return (lines[0],) if len(lines) == 1 else (" ".join(lines), "".join(lines))


def megatron_entry(lines: list[str]) -> dict[str, str]:
    """The fields of a Megatron iteration entry (`lines`: the line and the ones a paste wrapped it onto): the
    join that reads its counters."""
    for joined in joins(lines):
        if any(counter in (fields := megatron(joined) or {}) for counter in _COUNTERS):
            return fields
    return megatron(lines[0]) or {}


def starts_entry(text: str) -> bool:
    """Whether a line starts a log record of its own (a date, a time, a bracketed tag, a level, a Megatron
    iteration), rather than going on with the one before it."""
    return bool(_RECORD_START.match(text))


_RECORD_START = re.compile(
    r"\s*(?:\d{2,4}[-/]\d\d(?:[-/]\d\d)?[ T]\d\d:\d\d|\d\d:\d\d:\d\d|\[(?!\d+:\d\d(?::\d\d)?<)"
    r"|iteration\s+\d+\s*/"
    r"|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b|Traceback)"
)


def megatron_losses(line: dict[str, str]) -> list[str]:
    return [key for key in line if "loss" in key.lower() and "scale" not in key.lower()]


def count(line: dict[str, str], key: str) -> int | None:
    value = line.get(key, "").strip()
    return int(value) if value.isdecimal() else None
