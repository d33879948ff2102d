"""sftdoctor.plan.render: the `sftdoctor plan` text, the `train --dry-run` summary, the JSON and the run's timing."""

import json
import re

import pytest
from conftest import FIXTURES, PLAN_TERMS

from sftdoctor.plan.render import LORA_HEADER, render, summary, timing, to_json
from sftdoctor.run.memory import HEADROOM, Setting, Workload, adapters, fit
from sftdoctor.run.shape import closed_form

GIB = 2**30
LLAMA3_8B = closed_form(json.loads((FIXTURES / "model_config" / "Meta-Llama-3-8B.json").read_text()))
COUNTED = {"tokens_per_step": 64 * 4096, "steps": 100, "token_basis": "packed rows of 4,096 tokens"}


def planned(
    stage=2, micro=8, checkpointing=False, liger=False, world=8, global_batch=64, memory_gib=80.0, liger_available=True
):
    """Llama-3-8B at 4,096 tokens per row in bf16 with sdpa, on one node of `world` GPUs."""
    run = Workload(LLAMA3_8B, world, world, 4096, "sdpa", "bf16")
    return fit(
        run, Setting(stage, False, checkpointing, micro, liger), global_batch, int(memory_gib * GIB), liger_available
    )


def table_rows(
    text: str, header: str = "  ZeRO offload ckpt  micro accum liger  peak GiB  fits  compute comm"
) -> list[list[str]]:
    lines = text.splitlines()
    if header not in lines:  # no setting fits: no table
        return []
    start = lines.index(header) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_render_prints_the_model_the_gpus_and_the_run():
    lines = render(planned(), timing(planned(), COUNTED, "NVIDIA H100 80GB HBM3")).splitlines()
    assert lines[0] == (
        "model      llama: 8,030,261,248 parameters (32 layers, hidden 4096, vocab 128256; counted closed form)"
    )
    assert lines[1] == "GPUs       8 x 80.0 GiB (8 per node)"
    assert lines[2] == "run        4,096 tokens per row, global batch 64, bf16, sdpa"


def test_render_prints_every_term_and_their_sum_as_the_peak_per_gpu():
    fitted = planned()
    text = render(fitted, timing(fitted, COUNTED, None))
    for term in PLAN_TERMS:
        assert re.search(rf"^  {re.escape(term)}\s+\d+\.\d\d GiB", text, re.M), term
    current = fitted.current.estimate
    peaks = re.findall(r"^  = peak per GPU\s+(\d+\.\d\d) GiB$", text, re.M)
    assert peaks[0] == f"{current.gpu_peak / GIB:.2f}" == f"{sum(t.bytes for t in current.gpu) / GIB:.2f}"
    assert (
        "this run's setting: ZeRO-2, checkpointing off, micro-batch 8 x 1 accumulation, liger off — does NOT fit"
        in text
    )


def test_render_recommends_the_fastest_setting_that_fits_with_its_terms():
    fitted = planned()
    text = render(fitted, timing(fitted, COUNTED, None))
    assert (
        "recommended: ZeRO-2, checkpointing off, micro-batch 1 x 8 accumulation, liger on — "
        f"{fitted.recommended.estimate.gpu_peak / GIB:.1f} GiB per GPU"
    ) in text
    assert len(re.findall(r"^  = peak per GPU", text, re.M)) == 2  # the run's setting and the recommended one
    # TRL's fused LM head: no (tokens x vocab) logits, with or without liger
    assert "  logits and loss              2.43 GiB  TRL's fused LM head: a 4096 x 32768 tile" in text


def test_render_says_when_the_runs_own_setting_is_the_fastest_that_fits():
    fitted = planned(micro=1, liger=True)
    text = render(fitted, timing(fitted, COUNTED, None))
    assert "— fits" in text and "recommended: this run's setting (the fastest that fits)" in text
    assert len(re.findall(r"^  = peak per GPU", text, re.M)) == 1


def test_the_candidate_table_lists_only_settings_that_fit_fastest_first():
    fitted = planned()
    text = render(fitted, timing(fitted, COUNTED, None))
    fitting = [c for c in fitted.candidates if c.fits]
    assert 12 < len(fitting) < len(fitted.candidates)
    assert (
        f"settings that fit, fastest first (12 of {len(fitting)} that fit, {len(fitted.candidates)} tried; "
        "all in --json):"
    ) in text
    rows = table_rows(text)
    assert len(rows) == 12
    assert all(row[7] == "yes" and float(row[6]) <= 80 * (1 - HEADROOM) for row in rows)
    assert [(int(r[0]), r[2], int(r[3]), int(r[4]), r[5], r[6]) for r in rows] == [
        (
            c.setting.zero_stage,
            "on" if c.setting.checkpointing else "off",
            c.setting.micro_batch,
            c.accumulation,
            "on" if c.setting.liger else "off",
            f"{c.estimate.gpu_peak / GIB:.1f}",
        )
        for c in fitting[:12]
    ]
    assert rows[0][:6] == ["2", "no", "off", "1", "8", "on"]  # the recommended setting heads the table


def test_render_on_gpus_too_small_for_any_setting_recommends_none():
    fitted = planned(stage=0, micro=1, world=1, global_batch=8, memory_gib=16, liger_available=False)
    text = render(fitted, timing(fitted, COUNTED, None))
    assert fitted.recommended is None and fitted.candidates
    assert "recommended: none fits these GPUs; more GPUs, a shorter max_length, or ZeRO-3 with offload_params" in text
    assert f"no setting fits ({len(fitted.candidates)} tried; all in --json)" in text and "0 of 0" not in text
    assert table_rows(text) == []
    assert "cannot be shared evenly" not in text


def test_render_says_when_no_setting_reaches_the_global_batch():
    fitted = planned(micro=1, global_batch=100)
    text = render(fitted, timing(fitted, {**COUNTED, "tokens_per_step": 100 * 4096}, None))
    assert (
        "\n           global batch 100 cannot be shared evenly by 8 ranks: no setting reaches it "
        "(see the batch-size check)\n"
    ) in text
    assert "micro-batch 1 x no whole accumulation" in text
    assert "no setting fits (0 tried; all in --json)" in text and table_rows(text) == []


def test_an_unreachable_global_batch_is_not_blamed_on_gpu_memory():
    fitted = planned(micro=1, global_batch=100)
    text = render(fitted, timing(fitted, COUNTED, None))
    assert fitted.current.fits and "— fits" in text
    assert "none fits these GPUs" not in text
    assert "recommended: none: no setting reaches the global batch on these ranks (see the batch-size check)" in text


def test_render_without_a_known_gpu_memory_says_so():
    fitted = planned(memory_gib=0)
    assert "GPUs       8 x unknown memory (8 per node)" in render(fitted, timing(fitted, COUNTED, None))


def test_render_prints_the_tokens_and_the_time():
    fitted = planned()
    text = render(fitted, timing(fitted, COUNTED, "NVIDIA H100 80GB HBM3"))
    assert "tokens     262,144 per step (packed rows of 4,096 tokens)" in text
    assert text.endswith("time       100 steps; 4.5 s per step (MFU 0.40 of 989 TFLOPS per GPU); about 8 min")


def test_render_without_a_peak_or_a_throughput_asks_for_one():
    fitted = planned()
    assert render(fitted, timing(fitted, COUNTED, "Quadro RTX 8000")).endswith(
        "time       100 steps; give --peak-tflops or --tokens-per-second for a time"
    )
    assert render(fitted, timing(fitted, {**COUNTED, "steps": None}, None)).endswith(
        "time       steps unknown; give --peak-tflops or --tokens-per-second for a time"
    )


def test_a_run_of_hours_is_given_in_hours():
    fitted = planned()
    text = render(fitted, timing(fitted, {**COUNTED, "steps": 2000}, "NVIDIA H100 80GB HBM3"))
    assert "2,000 steps; 4.5 s per step" in text and text.endswith("; about 2.5 h")


def test_timing_from_mfu_and_the_gpus_peak():
    t = timing(planned(), COUNTED, "NVIDIA H100 80GB HBM3")
    assert t["peak_tflops"] == 989 and t["mfu"] == 0.4 and t["flops_per_token"] == 54_624_018_432
    assert t["step_seconds"] == pytest.approx(262_144 * 54_624_018_432 / (8 * 989e12 * 0.4))
    assert t["run_hours"] == pytest.approx(100 * t["step_seconds"] / 3600)
    assert t["basis"] == "MFU 0.40 of 989 TFLOPS per GPU"
    assert {k: t[k] for k in COUNTED} == COUNTED


def test_timing_with_a_given_peak_and_mfu_overrides_the_gpus_name():
    t = timing(planned(), COUNTED, "NVIDIA H100 80GB HBM3", mfu=0.5, tflops=312)
    assert t["basis"] == "MFU 0.50 of 312 TFLOPS per GPU" and t["peak_tflops"] == 312
    assert t["step_seconds"] == pytest.approx(262_144 * 54_624_018_432 / (8 * 312e12 * 0.5))


def test_timing_from_a_measured_throughput_ignores_mfu():
    t = timing(planned(), COUNTED, None, tokens_per_second=52_428.8)
    assert t["step_seconds"] == pytest.approx(5.0) and t["run_hours"] == pytest.approx(500 / 3600)
    assert t["basis"] == "measured 52,429 tokens/s"
    assert (
        t["step_seconds"]
        == timing(planned(), COUNTED, "NVIDIA H100 80GB HBM3", tokens_per_second=52_428.8)["step_seconds"]
    )


def test_timing_without_a_peak_or_a_throughput_has_no_time():
    t = timing(planned(), COUNTED, None)
    assert "step_seconds" not in t and "run_hours" not in t and "basis" not in t and t["peak_tflops"] is None


def test_timing_counts_the_recomputation_of_a_recommended_setting_with_checkpointing():
    roomy, tight = planned(memory_gib=80), planned(memory_gib=40)
    assert not roomy.recommended.setting.checkpointing and tight.recommended.setting.checkpointing
    seconds = [timing(f, COUNTED, "NVIDIA H100 80GB HBM3")["step_seconds"] for f in (roomy, tight)]
    assert seconds[1] == pytest.approx(seconds[0] * 4 / 3)


def test_summary_for_dry_run_names_the_fastest_setting_that_fits():
    fitted = planned()
    peak, best = fitted.current.estimate.gpu_peak / GIB, fitted.recommended.estimate.gpu_peak / GIB
    assert summary(fitted).splitlines() == [
        f"memory          predicted peak {peak:.1f} GiB per GPU of 80.0 GiB (does NOT fit)",
        f"                fastest that fits: ZeRO-2, checkpointing off, micro-batch 1 x 8 accumulation, "
        f"liger on ({best:.1f} GiB)",
        "                every term: sftdoctor plan RUN.toml",
    ]


def test_summary_is_two_lines_when_the_runs_setting_is_the_fastest_that_fits():
    fitted = planned(micro=1, liger=True)
    assert summary(fitted).splitlines() == [
        f"memory          predicted peak {fitted.current.estimate.gpu_peak / GIB:.1f} GiB per GPU of 80.0 GiB (fits)",
        "                every term: sftdoctor plan RUN.toml",
    ]


def test_summary_when_nothing_fits_has_no_fastest_line():
    fitted = planned(stage=0, micro=1, world=1, global_batch=8, memory_gib=16, liger_available=False)
    lines = summary(fitted).splitlines()
    assert len(lines) == 2 and lines[0].endswith("GiB per GPU of 16.0 GiB (does NOT fit)")


def test_to_json_terms_add_up_to_each_peak():
    fitted = planned()
    t = timing(fitted, COUNTED, "NVIDIA H100 80GB HBM3")
    doc = json.loads(json.dumps(to_json(fitted, t)))
    assert doc["model"]["parameters"] == 8_030_261_248 and doc["model"]["counted_by"] == "closed form"
    assert (doc["world_size"], doc["ranks_per_node"], doc["seq_len"], doc["attention"], doc["precision"]) == (
        8,
        8,
        4096,
        "sdpa",
        "bf16",
    )
    assert doc["gpu_memory_bytes"] == 80 * GIB and doc["global_batch_size"] == 64
    for c in [doc["current"], doc["recommended"], *doc["candidates"]]:
        assert sum(term["bytes"] for term in c["gpu_terms"]) == c["gpu_peak_bytes"]
        assert sum(term["bytes"] for term in c["host_terms"]) == c["host_peak_bytes"]
    assert [term["name"] for term in doc["current"]["gpu_terms"]] == list(PLAN_TERMS[:-1])
    assert (
        len(doc["candidates"]) == len(fitted.candidates) and doc["recommended"]["fits"] and not doc["current"]["fits"]
    )
    assert doc["time"] == pytest.approx(t)


def test_to_json_without_a_fitting_setting_has_no_recommendation():
    fitted = planned(micro=1, global_batch=100)
    doc = to_json(fitted, timing(fitted, COUNTED, None))
    assert doc["recommended"] is None and doc["candidates"] == []
    assert doc["current"]["gradient_accumulation_steps"] is None


# ---------------------------------------------------------------- LoRA

R16 = {"r": 16, "dropout": 0.05, "target_modules": "all-linear", "modules_to_save": [], "trainable_params": None}
LORA_TERMS = (
    "frozen base",
    "adapter weights",
    "adapter gradients",
    "adapter optimizer states",
    "activations",
    "logits and loss",
    "fragmentation",
    "CUDA context and NCCL",
    "host RAM per node",
)


def planned_lora(quantize="none", stage=2, world=8, global_batch=64, memory_gib=80.0):
    """Llama-3-8B with r = 16 adapters on every linear layer, checkpointed, micro-batch 1, no liger."""
    run = Workload(LLAMA3_8B, world, world, 4096, "sdpa", "bf16", adapters(R16, LLAMA3_8B))
    return fit(run, Setting(stage, False, True, 1, False, quantize), global_batch, int(memory_gib * GIB), False)


def test_render_names_the_adapters_and_counts_their_terms_instead_of_the_full_models():
    fitted = planned_lora()
    text = render(fitted, timing(fitted, COUNTED, None))
    assert text.splitlines()[3] == (
        "adapters   LoRA on the 16-bit base: r 16, dropout 0.05 on q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
        "down_proj; 41,943,040 trainable parameters (0.52% of the base)"
    )
    for term in LORA_TERMS:
        assert re.search(rf"^  {re.escape(term)}\s+\d+\.\d\d GiB", text, re.M), term
    assert not re.search(r"^  (weights|gradients|optimizer states) ", text, re.M)  # nothing of the base trains
    assert (
        "this run's setting: LoRA, ZeRO-2, checkpointing on, micro-batch 1 x 8 accumulation, liger off — fits" in text
    )
    assert "  frozen base                 14.96 GiB  2 B x base params (the run's dtype; frozen)" in text


def test_the_lora_candidate_table_shows_each_settings_base():
    fitted = planned_lora()
    rows = table_rows(render(fitted, timing(fitted, COUNTED, None)), LORA_HEADER)
    fitting = [c for c in fitted.candidates if c.fits]
    assert len(rows) == 12 and all(row[6] == "16-bit" for row in rows)  # the 16-bit base fits: no QLoRA row
    assert [(int(r[0]), int(r[3]), r[7]) for r in rows] == [
        (c.setting.zero_stage, c.setting.micro_batch, f"{c.estimate.gpu_peak / GIB:.1f}") for c in fitting[:12]
    ]


def test_where_no_16bit_base_fits_the_plan_recommends_a_4bit_one():
    fitted = planned_lora(stage=0, world=1, global_batch=8, memory_gib=16)  # 15 GiB of 16-bit base on 16 GiB
    text = render(fitted, timing(fitted, COUNTED, None))
    assert "— does NOT fit" in text and fitted.recommended.setting.quantize == "4bit"
    assert "recommended: QLoRA 4-bit base, ZeRO-1, checkpointing on, micro-batch 2 x 4 accumulation, liger off" in text
    assert (
        "  frozen base, 4-bit           3.35 GiB  (1/2 + 1/64 + 4/(64 x 256)) B x linear weights: bitsandbytes NF4"
        in text
    )
    rows = table_rows(text, LORA_HEADER)
    assert rows and all(row[6] == "4-bit" for row in rows)
    assert "fastest that fits: QLoRA 4-bit base, ZeRO-1" in summary(fitted)


def test_to_json_carries_the_adapters_and_each_settings_base():
    doc = json.loads(json.dumps(to_json(planned_lora(), timing(planned_lora(), COUNTED, None))))
    assert doc["lora"] == {
        "trainable": 41_943_040,
        "r": 16,
        "dropout": 0.05,
        "wrapped": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    }
    assert {c["setting"]["quantize"] for c in doc["candidates"]} == {"none"}
    assert sum(t["bytes"] for t in doc["current"]["gpu_terms"]) == doc["current"]["gpu_peak_bytes"]
    assert to_json(planned(), timing(planned(), COUNTED, None))["lora"] is None
