"""The repair of untrained rows ([model] repair_untrained_tokens) on a real torch module: the mean it writes is
taken over trained rows only, never over a row holding NaN or inf (which would write inf into every repaired row)."""

import pytest

from sftdoctor.train.embeddings import repair

pytestmark = pytest.mark.slow  # imports torch


def test_the_mean_leaves_out_zero_and_non_finite_rows_in_both_untied_tables():
    import torch

    class Untied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False)

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    model = Untied()
    for weight in (model.embed.weight, model.head.weight):
        with torch.no_grad():
            weight.copy_(torch.arange(32, dtype=torch.float32).reshape(8, 4) + 1)
            weight[[1, 2]] = 0.0
            weight[5, 0], weight[6, 3] = float("nan"), float("inf")
    repair(model, (1, 2), partitioned=False)
    for weight in (model.embed.weight, model.head.weight):
        expected = weight[[0, 3, 4, 7]].mean(dim=0)
        assert torch.isfinite(weight[[1, 2]]).all()
        assert torch.equal(weight[1], expected) and torch.equal(weight[2], expected)
