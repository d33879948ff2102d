"""known-bad-versions: installed releases with a known upstream bug that the run's settings hit, on real DeepSpeed
configs from public repositories (tests/fixtures/deepspeed/index.json) and the versions each fix shipped in."""

import pytest
from conftest import FIXTURES, plan_of, run_of, severities

from sftdoctor.checks.advisories import ADVISORIES, affected
from sftdoctor.facts.configs import read_json_object

CURRENT = {"deepspeed": "0.19.8", "transformers": "5.24.0", "liger-kernel": "0.8.5", "flash-attn": None}
TORCH = {"version": "2.13.0+cu128", "cuda": "12.8"}


def ds(name):
    return {"path": name, "config": read_json_object(FIXTURES / "deepspeed" / name, "DeepSpeed config")}


def plan(accumulation, **training):
    """A ZeRO-2 plan on one rank whose global batch takes `accumulation` micro-batches of 1."""
    made = plan_of(
        run_of(
            training={"global_batch_size": accumulation, "per_device_batch_size": 1, **training},
            launch={"nproc_per_node": 1},
            deepspeed={"zero_stage": 2},
        ),
        gpus={"devices": []},
    )
    assert made.gradient_accumulation_steps == accumulation
    return made


def advisories(findings):
    return [f.evidence.get("advisory") for f in findings if f.severity.value != "ok"]


@pytest.mark.parametrize(
    "name, hit",
    [
        ("axolotl_zero2.json", True),
        ("FastChat_deepspeed_config_s2.json", True),
        ("axolotl_zero1.json", True),  # ZeRO-1 reads overlap_comm since 0.13.0
        ("LLaMA-Factory_ds_z2_config.json", False),  # "overlap_comm": false, for this bug
        ("LLaMA-Factory_ds_z0_config.json", False),
        ("DeepSpeedExamples_ds_fp16_z1_config.json", False),  # no overlap_comm key: off by default for ZeRO-1/2
    ],
)
def test_zero12_overlap_comm_on_a_deepspeed_before_0_19_is_a_warning_with_its_sources(run, name, hit):
    findings = run(
        "known-bad-versions", packages={**CURRENT, "deepspeed": "0.16.4"}, torch_build=TORCH, deepspeed_config=ds(name)
    )
    found = [f for f in findings if f.evidence.get("advisory") == "deepspeed-overlap-comm-zero12"]
    assert bool(found) is hit
    if hit:
        [finding] = found
        assert finding.severity.value == "warning" and finding.title.startswith("deepspeed 0.16.4: ZeRO-")
        assert "https://github.com/deepspeedai/DeepSpeed/pull/7965" in finding.evidence["sources"]
        assert finding.fix.startswith('pip install -U "deepspeed>=0.19.0"')


def test_zero1_before_0_13_ignored_overlap_comm_and_is_not_hit(run):
    findings = run(
        "known-bad-versions",
        packages={**CURRENT, "deepspeed": "0.12.6"},
        torch_build=TORCH,
        deepspeed_config=ds("axolotl_zero1.json"),
    )
    assert "deepspeed-overlap-comm-zero12" not in advisories(findings)


def test_the_current_stack_passes_and_says_what_it_checked(run):
    findings = run("known-bad-versions", packages=CURRENT, torch_build=TORCH, deepspeed_config=ds("axolotl_zero2.json"))
    assert severities(findings) == ["ok"]
    assert "deepspeed 0.19.8, transformers 5.24.0, liger-kernel 0.8.5" in findings[0].title


def test_sftdoctors_generated_config_on_its_pinned_deepspeed_is_not_hit_but_on_an_older_one_is(run):
    """run/resolve.py generates overlap_comm + contiguous_gradients for ZeRO-2: safe only from 0.19.0 on."""
    generated = plan(1)
    assert severities(run("known-bad-versions", packages=CURRENT, torch_build=TORCH, plan=generated)) == ["ok"]
    old = run("known-bad-versions", packages={**CURRENT, "deepspeed": "0.18.6"}, torch_build=TORCH, plan=generated)
    assert advisories(old) == ["deepspeed-overlap-comm-zero12"]


@pytest.mark.parametrize("torch, hit", [("2.10.0+cu128", True), ("2.9.1+cu128", False)])
def test_zero3_overlap_before_0_18_8_is_hit_on_torch_2_10_only(run, torch, hit):
    findings = run(
        "known-bad-versions",
        packages={**CURRENT, "deepspeed": "0.18.7"},
        torch_build={"version": torch, "cuda": "12.8"},
        deepspeed_config=ds("axolotl_zero3_bf16.json"),
    )
    assert ("deepspeed-zero3-overlap-torch210" in advisories(findings)) is hit


@pytest.mark.parametrize("accumulation, hit", [(4, True), (1, False)])
def test_deepspeed_0_18_3_with_accumulation_divides_gradients_twice(run, accumulation, hit):
    findings = run(
        "known-bad-versions", packages={**CURRENT, "deepspeed": "0.18.3"}, torch_build=TORCH, plan=plan(accumulation)
    )
    assert ("deepspeed-accumulation-scaled-twice" in advisories(findings)) is hit


@pytest.mark.parametrize(
    "version, expected",
    [
        ("4.45.2", ["transformers-accumulation-loss"]),
        ("4.47.1", ["transformers-accumulation-kwargs"]),
        ("4.48.1", []),
        ("5.24.0", []),
    ],
)
def test_transformers_accumulation_bugs_by_release(run, version, expected):
    findings = run("known-bad-versions", packages={**CURRENT, "transformers": version}, torch_build=TORCH, plan=plan(8))
    assert advisories(findings) == expected


def test_without_the_run_settings_an_affected_release_is_info_that_says_it_cannot_tell(run):
    """No run config and no DeepSpeed JSON: the accumulation steps are unknown, never assumed to be 1."""
    findings = run("known-bad-versions", packages={**CURRENT, "transformers": "4.45.2"}, torch_build=TORCH)
    [finding] = findings
    assert finding.severity.value == "info" and "cannot tell whether this run uses that" in finding.title
    assert finding.fix.startswith("give the run config (--config) to judge")


def test_liger_before_0_4_1_with_accumulation_on_transformers_4_46(run):
    packages = {**CURRENT, "transformers": "4.48.1", "liger-kernel": "0.3.1"}
    hit = run("known-bad-versions", packages=packages, torch_build=TORCH, plan=plan(8, liger_kernel=True))
    assert advisories(hit) == ["liger-kernel-accumulation"]
    off = run("known-bad-versions", packages=packages, torch_build=TORCH, plan=plan(8, liger_kernel=False))
    assert advisories(off) == []


# A wheel URL as `pip freeze` prints it for a flash-attn installed from a release asset (public freezes show this
# form; the tag format is flash-attention's setup.py get_wheel_url).
WHEEL = (
    "https://github.com/Dao-AILab/flash-attention/releases/download/v2.3.4/"
    "flash_attn-2.3.4+cu122torch2.1cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"
)


@pytest.mark.parametrize("torch, hit", [("2.5.1+cu124", True), ("2.1.2+cu121", False), ("2.1.2+cu118", True)])
def test_a_flash_attn_wheel_built_for_another_torch_or_cuda_major_is_named(run, torch, hit):
    findings = run(
        "known-bad-versions",
        packages={**CURRENT, "flash-attn": "2.3.4"},
        torch_build={"version": torch, "cuda": torch[-3:-1] + "." + torch[-1]},
        flash_attn={"installed": True, "version": "2.3.4", "import_ok": True, "wheel": WHEEL},
    )
    found = [f for f in findings if f.evidence.get("advisory") == "flash-attn-wheel-torch"]
    assert bool(found) is hit
    if hit:
        assert found[0].title.startswith("flash-attn 2.3.4: flash-attn's wheel was built for torch 2.1 (CUDA 12)")


@pytest.mark.parametrize("advisory", ADVISORIES, ids=[a.id for a in ADVISORIES])
def test_every_advisory_cites_its_sources_and_bounds_its_releases(advisory):
    assert advisory.sources and all(url.startswith("https://") for url in advisory.sources)
    first, fixed = advisory.affected
    if fixed:
        assert affected(advisory, first or "0.0.1") and not affected(advisory, fixed)
