"""Which embedding rows were never trained, and the ids the plan repairs."""

from sftdoctor.run.embeddings import repair_ids, untrained


def table(**rows):
    return {
        "median_norm": 8.0,
        "rows": {token: {"id": i, "max_abs": m, "norm": n} for token, (i, m, n) in rows.items()},
    }


def test_zero_and_faint_rows_are_untrained_and_ordinary_ones_are_not():
    found = untrained(table(**{"<|im_start|>": (1, 0.0, 0.0), "<|im_end|>": (2, 0.01, 0.3), "<eos>": (3, 0.9, 7.5)}))
    assert found == {"<|im_start|>": "all zeros", "<|im_end|>": "norm 0.3, 3.8% of an ordinary row's 8"}


def test_a_row_near_an_ordinary_one_and_a_token_outside_the_table_are_not_judged_untrained():
    rows = table(**{"<|im_end|>": (2, 0.2, 0.41)})
    rows["rows"]["<new>"] = {"id": 900, "outside": 384}
    assert untrained(rows) == {}  # 5.1% of the median: above the threshold


def test_the_plan_repairs_the_untrained_ids_of_both_tables_once():
    fact = {
        "input": table(**{"<|im_start|>": (1, 0.0, 0.0), "<|im_end|>": (2, 0.5, 6.0)}),
        "output": table(**{"<|im_start|>": (1, 0.0, 0.0), "<|im_end|>": (2, 0.0, 0.0)}),
    }
    assert repair_ids(fact) == (1, 2)
    assert repair_ids({"error": "the probe took over 300 s"}) == () and repair_ids(None) == ()
