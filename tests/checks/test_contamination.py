"""contamination, on the scan's results: dirty share against the threshold, sources too short to judge."""

from sftdoctor.checks.contamination import contamination

EXAMPLE = {"train": "data/train.jsonl line 88", "eval": "mmlu_anatomy document 7", "overlap": "a b c"}


def verdicts(**sources):
    return [
        (f.severity.value, f.title) for f in contamination({"train_rows": 1000, "seconds": 1.0, "sources": sources})
    ]


def source(docs, touched, short=0):
    return {"docs": docs, "touched": touched, "too_short": short, "examples": [EXAMPLE] * min(touched, 3)}


def test_dirty_documents_above_one_percent_are_a_warning_below_it_information():
    assert verdicts(mmlu_anatomy=source(135, 3)) == [
        (
            "warning",
            "mmlu_anatomy: 3 of 135 documents (2.2%) occur in the training rows (word 13-grams), e.g. "
            "mmlu_anatomy document 7 in data/train.jsonl line 88",
        )
    ]
    assert verdicts(hellaswag=source(10042, 12))[0][0] == "info"


def test_clean_and_unjudged_sources_are_each_said():
    assert verdicts(gsm8k=source(1319, 0, short=2), tiny=source(50, 0, short=50)) == [
        (
            "ok",
            "gsm8k: none of 1317 documents occurs in the 1,000 training rows (word 13-grams); 2 of its documents "
            "are too short to judge (under 8 words)",
        ),
        ("info", "tiny: not judged: its 50 documents are too short (under 8 words)"),
    ]


def test_a_scan_that_failed_is_a_warning_never_clean():
    [finding] = [contamination({"error": "the contamination scan took over 1800 s"})]
    assert finding.severity.value == "warning" and "could not be compared" in finding.title


def test_the_rule_that_judged_each_source_is_named_with_its_count_when_several_did():
    mixed = {
        **source(100, 0, short=4),
        "rules": {"word 13-grams": 6, "CJK character 25-grams": 90},
        "too_short_below": "15 characters",
    }
    assert verdicts(ceval=mixed) == [
        (
            "ok",
            "ceval: none of 96 documents occurs in the 1,000 training rows (word 13-grams for 6, CJK character "
            "25-grams for 90); 4 of its documents are too short to judge (under 15 characters)",
        )
    ]
    dirty = {
        **source(10, 2),
        "rules": {"CJK character 25-grams": 10},
        "examples": [{**EXAMPLE, "shared": "25 characters", "rule": "CJK character 25-grams"}],
    }
    [finding] = contamination({"train_rows": 1000, "seconds": 1.0, "sources": {"cmmlu": dirty}})
    assert "(CJK character 25-grams)" in finding.title and finding.detail.startswith("Shared 25 characters: ")


def test_a_source_that_was_not_read_or_holds_nothing_is_never_clean():
    found = contamination(
        {
            "train_rows": 1000,
            "seconds": 1.0,
            "sources": {
                "eval file a/test.jsonl": {"error": "a/test.jsonl: cannot read the data file: Input/output error"},
                "empty_task": source(0, 0),
            },
        }
    )
    assert [(f.severity.value, f.title) for f in found] == [
        ("warning", "eval file a/test.jsonl: not judged: a/test.jsonl: cannot read the data file: Input/output error"),
        ("info", "empty_task: not judged: it has no documents"),
    ]
    [none_read] = contamination({"train_rows": 0, "seconds": 0.0, "sources": {"gsm8k": source(10, 0)}})
    assert none_read.severity.value == "info" and "no training row was read" in none_read.title
