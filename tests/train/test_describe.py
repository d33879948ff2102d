"""What `sftdoctor train` prints of its plan: where each setting came from, and the memory plan."""

import json
from dataclasses import asdict

from conftest import FIXTURES, make_run, plan_of, recorded_gpus

from sftdoctor.facts import Facts
from sftdoctor.run.shape import closed_form
from sftdoctor.train.describe import describe, memory_summary

H100x8 = "h100_sxm_8x_driver550_modal_glossary.txt"


def test_describe_names_where_the_precision_and_port_came_from(tmp_path):
    plan = plan_of(
        make_run(tmp_path, launch={"nproc_per_node": 2}),
        gpus=recorded_gpus(H100x8),
        rendezvous={"master_port": 29500, "in_use": True, "free_port": 40001},
    )
    text = describe(plan)
    assert "rendezvous      127.0.0.1:40001 (the default 29500 is taken here: a free port)" in text
    assert "precision       bf16 (weights loaded in float32)" in text and "1 node)" in text


def test_dry_run_shows_the_memory_plan_when_there_are_gpus(tmp_path):
    llama8b = closed_form(json.loads((FIXTURES / "model_config" / "Meta-Llama-3-8B.json").read_text()))
    run = make_run(
        tmp_path,
        data={"max_length": 4096},
        training={"per_device_batch_size": 8, "global_batch_size": 64, "gradient_checkpointing": False},
        deepspeed={"zero_stage": 2},
    )
    facts = Facts.replay({"model_shape": asdict(llama8b), "gpus": recorded_gpus(H100x8), "packages": {}})
    text = memory_summary(plan_of(run, gpus=recorded_gpus(H100x8)), facts)
    assert "does NOT fit" in text and "fastest that fits: ZeRO-2" in text and "sftdoctor plan RUN.toml" in text
