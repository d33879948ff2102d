"""zero-resume: the checkpoint --resume would load, read from its file names, against this launch's world size and
ZeRO stage; on checkpoint layouts recorded from real runs (tests/fixtures/checkpoints/index.json cites each)."""

import dataclasses

import pytest
from conftest import index, plan_of, run_of, severities

from sftdoctor.checks import Skipped
from sftdoctor.facts import Facts, Inputs
from sftdoctor.facts.resume_checkpoint import describe, layout
from sftdoctor.run.checkpoints import MARKER

LAYOUTS = {entry["name"]: entry for entry in index("checkpoints")}
ZERO2, ZERO3 = LAYOUTS["zero2-2ranks-fp32-sftdoctor-cpu"], LAYOUTS["zero3-2ranks-bf16-hf-trainer"]


def saved(tmp_path, entry, complete=True, latest=True, step=None):
    """The recorded checkpoint's files (empty) under tmp_path/out/checkpoint-N; its path."""
    tag = entry["latest"]
    folder = tmp_path / "out" / f"checkpoint-{step or int(tag.removeprefix('global_step'))}"
    for sub, names in entry["files"].items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / sub / name).write_text("")
    (folder / "latest").write_text(tag if latest else "")
    (folder / MARKER).unlink(missing_ok=True)
    if complete:
        (folder / MARKER).write_text("1\n")
    return folder


def launch(tmp_path, world=2, stage=2, **deepspeed):
    ds = {"deepspeed": {"zero_stage": stage}} if stage else {}
    plan = plan_of(run_of(launch={"nproc_per_node": world}, training={"output_dir": str(tmp_path / "out")}, **ds))
    if deepspeed:
        plan = dataclasses.replace(plan, deepspeed={**plan.deepspeed, **deepspeed})
    return plan


@pytest.mark.parametrize("entry", list(LAYOUTS.values()), ids=list(LAYOUTS))
def test_each_recorded_layout_reads_as_the_world_size_and_stage_that_saved_it(entry):
    found = layout(entry["files"][entry["latest"]])
    assert (found["world_size"], found["zero3"]) == (entry["world_size"], entry["zero3"])
    assert layout(entry["files"][""]) is None  # the checkpoint's own files hold no ZeRO states


def test_the_probe_reads_the_newest_complete_checkpoint_of_the_plans_output_dir(tmp_path):
    saved(tmp_path, ZERO2)
    saved(tmp_path, ZERO3, complete=False, step=200)  # newer, but half-written: --resume would not load it
    facts = Facts.replay({"plan": launch(tmp_path)}, Inputs())
    from sftdoctor.facts.resume_checkpoint import probe_resume_checkpoint

    found = probe_resume_checkpoint(facts)
    assert found["step"] == 2 and found["latest"] == "global_step2" and found["deepspeed"]["world_size"] == 2
    assert probe_resume_checkpoint(Facts.replay({"plan": launch(tmp_path / "empty")}, Inputs())) is None


def test_the_same_world_size_and_stage_is_ok(tmp_path, run):
    [finding] = run("zero-resume", resume_checkpoint=describe(saved(tmp_path, ZERO2)), plan=launch(tmp_path, 2, 2))
    assert severities([finding]) == ["ok"] and "ZeRO-1/2 on 2 ranks, as this launch" in finding.title
    [one] = run("zero-resume", resume_checkpoint=describe(saved(tmp_path, ZERO2)), plan=launch(tmp_path, 2, 1))
    assert severities([one]) == ["ok"]  # ZeRO-1 and ZeRO-2 write the same files


def test_another_world_size_is_an_error_naming_both_and_the_universal_conversion(tmp_path, run):
    checkpoint = saved(tmp_path, ZERO2)
    [finding] = run("zero-resume", resume_checkpoint=describe(checkpoint), plan=launch(tmp_path, 1, 2))
    assert severities([finding]) == ["error"]
    assert finding.title == (
        f"{checkpoint} was saved by ZeRO-1/2 on 2 ranks; this launch is ZeRO-2 on 1 rank: "
        "DeepSpeed cannot resume it on another world size"
    )
    assert "used a DP world size of 2 but the current world size is 1" in finding.detail
    assert (
        f"python -m deepspeed.checkpoint.ds_to_universal --input_folder {checkpoint}/global_step2 "
        f"--output_folder {checkpoint}/global_step2_universal"
    ) in finding.fix
    assert '"load_universal": true' in finding.fix and "launch on 2 ranks" in finding.fix
    assert finding.evidence["launch"] == {"world_size": 1, "zero_stage": 2, "deepspeed": True}


def test_a_zero3_checkpoint_resumed_with_zero2_is_an_error_about_the_stage(tmp_path, run):
    [finding] = run("zero-resume", resume_checkpoint=describe(saved(tmp_path, ZERO3)), plan=launch(tmp_path, 2, 2))
    assert severities([finding]) == ["error"] and "cannot resume it on another ZeRO stage" in finding.title
    assert "saved by ZeRO-3 on 2 ranks" in finding.title
    [back] = run("zero-resume", resume_checkpoint=describe(saved(tmp_path / "z2", ZERO2)), plan=launch(tmp_path, 2, 3))
    assert severities([back]) == ["error"] and "another ZeRO stage" in back.title


def test_a_universal_copy_loads_on_any_world_size_and_a_missing_one_is_an_error(tmp_path, run):
    checkpoint = saved(tmp_path, ZERO2)
    plan = launch(tmp_path, 4, 2, checkpoint={"load_universal": True})
    [missing] = run("zero-resume", resume_checkpoint=describe(checkpoint), plan=plan)
    assert severities([missing]) == ["error"] and "no universal copy" in missing.title
    assert f"--input_folder {checkpoint}/global_step2 " in missing.fix
    (checkpoint / "global_step2_universal").mkdir()
    (checkpoint / "latest_universal").write_text("global_step2_universal")
    [there] = run("zero-resume", resume_checkpoint=describe(checkpoint), plan=plan)
    assert severities([there]) == ["info"] and "global_step2_universal loads on 4 ranks" in there.title


def test_deepspeed_on_one_side_only(tmp_path, run):
    plain = tmp_path / "plain" / "out" / "checkpoint-2"
    plain.mkdir(parents=True)
    (plain / "optimizer.pt").write_text("")
    [refused] = run("zero-resume", resume_checkpoint=describe(plain), plan=launch(tmp_path / "plain", 2, 2))
    assert severities([refused]) == ["error"] and "Can't find a valid checkpoint" in refused.title
    [lost] = run("zero-resume", resume_checkpoint=describe(saved(tmp_path, ZERO2)), plan=launch(tmp_path, 2, 0))
    assert severities([lost]) == ["warning"] and "optimizer state (Adam moments) will not be restored" in lost.title
    skipped = run("zero-resume", resume_checkpoint=describe(plain), plan=launch(tmp_path / "plain", 2, 0))
    assert isinstance(skipped, Skipped) and "neither" in skipped.reason


def test_a_checkpoint_whose_latest_names_no_tag_is_an_error(tmp_path, run):
    checkpoint = saved(tmp_path, ZERO2, latest=False)
    [finding] = run("zero-resume", resume_checkpoint=describe(checkpoint), plan=launch(tmp_path, 2, 2))
    assert severities([finding]) == ["error"] and "latest" in finding.title
    assert f"{checkpoint}/latest" in finding.fix and "global_step2" in finding.fix


def test_without_a_checkpoint_the_check_is_skipped_saying_so(tmp_path, run):
    skipped = run("zero-resume", plan=launch(tmp_path, 2, 2))
    assert isinstance(skipped, Skipped) and "nothing to resume" in skipped.reason
