"""contamination, on the scan's results: dirty share against the threshold, sources too short to judge."""

from sftdoctor.checks.contamination import contamination

EXAMPLE = {"train": "data/train.jsonl line 88", "eval": "mmlu_anatomy document 7", "overlap": "a b c"}


def verdicts(**sources):
    return [(f.severity.value, f.title) for f in contamination({"train_rows": 1000, "seconds": 1.0, "sources": sources})]


def source(docs, touched, short=0):
    return {"docs": docs, "touched": touched, "too_short": short, "examples": [EXAMPLE] * min(touched, 3)}


def test_dirty_documents_above_one_percent_are_a_warning_below_it_information():
    assert verdicts(mmlu_anatomy=source(135, 3)) == [
        ("warning", "mmlu_anatomy: 3 of 135 documents (2.2%) occur in the training rows, e.g. mmlu_anatomy document 7 "
                    "in data/train.jsonl line 88")]
    assert verdicts(hellaswag=source(10042, 12))[0][0] == "info"


def test_clean_and_unjudged_sources_are_each_said():
    assert verdicts(gsm8k=source(1319, 0, short=2), tiny=source(50, 0, short=50)) == [
        ("ok", "gsm8k: none of 1317 documents occurs in the 1,000 training rows; 2 of its documents are too short to "
               "judge (under 8 words)"),
        ("info", "tiny: not judged: its 50 documents are too short (under 8 words)")]


def test_a_scan_that_failed_is_a_warning_never_clean():
    [finding] = [contamination({"error": "the contamination scan took over 1800 s"})]
    assert finding.severity.value == "warning" and "could not be compared" in finding.title
