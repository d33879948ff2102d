"""sftdoctor.findings: severities and their order, a finding's JSON, and the ok/info/warning/error helpers."""

import json

import pytest

from sftdoctor.findings import Finding, Severity, error, info, ok, warning


def test_severity_ranks_order_ok_info_warning_error():
    assert [s.rank for s in Severity] == [0, 1, 2, 3]
    assert sorted([Severity.ERROR, Severity.OK, Severity.WARNING, Severity.INFO], key=lambda s: s.rank) == [
        Severity.OK,
        Severity.INFO,
        Severity.WARNING,
        Severity.ERROR,
    ]


def test_severity_is_its_text():
    assert Severity("warning") is Severity.WARNING
    assert Severity.ERROR == "error" and Severity.OK.value == "ok"
    with pytest.raises(ValueError):
        Severity("fatal")


def test_to_json_has_every_field_and_the_severity_as_text():
    finding = warning(
        "2 of 4 GPUs over PCIe",
        "no NVLink between 0 and 1",
        "use NVLink pairs",
        explain="gpu-topology",
        evidence={"pairs": [[0, 1]]},
        id="gpu-topology",
    )
    data = finding.to_json()
    assert data == {
        "severity": "warning",
        "title": "2 of 4 GPUs over PCIe",
        "detail": "no NVLink between 0 and 1",
        "fix": "use NVLink pairs",
        "explain": "gpu-topology",
        "evidence": {"pairs": [[0, 1]]},
        "id": "gpu-topology",
        "silenced": False,
    }
    assert json.loads(json.dumps(data)) == data


def test_to_json_of_a_bare_finding_has_empty_fields():
    assert Finding(Severity.OK, "fine").to_json() == {
        "severity": "ok",
        "title": "fine",
        "detail": "",
        "fix": "",
        "explain": "",
        "evidence": {},
        "id": "",
        "silenced": False,
    }


@pytest.mark.parametrize(
    "helper, severity", [(info, Severity.INFO), (warning, Severity.WARNING), (error, Severity.ERROR)]
)
def test_info_warning_error_take_title_detail_and_fix_in_order(helper, severity):
    finding = helper("title", "detail", "fix", id="x", evidence={"n": 1})
    assert (finding.severity, finding.title, finding.detail, finding.fix) == (severity, "title", "detail", "fix")
    assert finding.id == "x" and finding.evidence == {"n": 1}


def test_ok_takes_title_and_detail_and_a_fix_only_by_name():
    finding = ok("torch 2.5.1 matches CUDA 12.4", "driver 550")
    assert (finding.severity, finding.title, finding.detail, finding.fix) == (
        Severity.OK,
        "torch 2.5.1 matches CUDA 12.4",
        "driver 550",
        "",
    )
    assert ok("t", fix="nothing to do").fix == "nothing to do"


def test_each_finding_has_its_own_evidence():
    first, second = ok("a"), ok("b")
    first.evidence["seen"] = 1
    assert second.evidence == {}
