"""flash-attn: installed, importable against this torch, and usable on these GPUs (recorded GPUs)."""

from conftest import NO_GPU, plan_of, recorded_gpus, run_of, severities

from sftdoctor.checks import Skipped

A100 = "a100_80g_pcie_4x_driver525_princeton.txt"
V100 = "v100_pcie_4x_driver470_cuda114_princeton.txt"
# The ImportError of a flash-attn wheel built against another torch, as reported in
# https://github.com/X-PLUG/mPLUG-Owl/issues/192 (also Dao-AILab/flash-attention#931).
UNDEFINED = (
    "ImportError: /usr/local/lib/python3.10/dist-packages/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: "
    "undefined symbol: _ZN3c104cuda9SetDeviceEi"
)
FLASH_OK = {"installed": True, "version": "2.7.4.post1", "import_ok": True, "import_error": None}
FLASH_BROKEN = {"installed": True, "version": "2.7.4.post1", "import_ok": False, "import_error": UNDEFINED}
ASKED = plan_of(run_of(model={"attn_implementation": "flash_attention_2"}))


def test_flash_attn_importing_on_ampere_is_ok(run):
    findings = run("flash-attn", packages={"flash-attn": "2.7.4.post1"}, flash_attn=FLASH_OK, gpus=recorded_gpus(A100))
    assert severities(findings) == ["ok"]


def test_abi_mismatch_is_an_error_that_names_the_symbol(run):
    findings = run(
        "flash-attn", packages={"flash-attn": "2.7.4.post1"}, flash_attn=FLASH_BROKEN, gpus=recorded_gpus(A100)
    )
    assert severities(findings) == ["error"]
    assert "another torch version or C++ ABI" in findings[0].title and "_ZN3c104cuda9SetDeviceEi" in findings[0].detail


def test_flash_attn_on_v100_warns_and_errors_when_requested(run):
    base = dict(packages={"flash-attn": "2.7.4.post1"}, flash_attn=FLASH_OK, gpus=recorded_gpus(V100))
    assert severities(run("flash-attn", **base)) == ["warning"]
    findings = run("flash-attn", plan=ASKED, **base)
    assert severities(findings) == ["error"] and "Ampere" in findings[0].detail


def test_requested_but_not_installed_is_an_error(run):
    findings = run(
        "flash-attn",
        packages={"flash-attn": None},
        flash_attn={"installed": False},
        gpus=recorded_gpus(A100),
        plan=ASKED,
    )
    assert severities(findings) == ["error"] and "not installed" in findings[0].title


def test_not_installed_is_advice_on_ampere_and_nothing_elsewhere(run):
    args = dict(packages={"flash-attn": None}, flash_attn={"installed": False})
    assert severities(run("flash-attn", gpus=recorded_gpus(A100), **args)) == ["info"]
    assert isinstance(run("flash-attn", gpus=NO_GPU, **args), Skipped)
