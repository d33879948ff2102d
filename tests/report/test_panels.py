"""The panels (report/panels.py): thinning long series, which panels a run gets."""

import pytest

from sftdoctor.report.panels import MAX_POINTS, PANELS, PlottedRun, shown, thin


def test_a_long_series_is_thinned_and_keeps_its_spikes():
    xs = list(range(100_000))
    ys = [1.0] * 100_000
    ys[54_321], ys[77_777] = 50.0, -3.0
    tx, ty = thin(xs, ys)
    assert len(tx) <= MAX_POINTS and tx == sorted(tx)
    assert 50.0 in ty and -3.0 in ty and tx[ty.index(50.0)] == 54_321
    assert thin(xs[:100], ys[:100]) == (xs[:100], ys[:100])


def test_a_panel_shows_when_any_run_logged_its_series():
    def run(*names):
        return PlottedRun({"series": {n: {"steps": [1], "values": [1.0]} for n in names}}, [], "r", "#000", [])

    assert [p.name for p in shown([run("loss", "learning_rate")])] == ["loss", "learning-rate"]
    assert "loss-scale" in [p.name for p in shown([run("loss"), run("loss_scale")])]
    assert [p.name for p in PANELS] == ["loss", "learning-rate", "grad-norm", "loss-scale", "throughput", "memory"]


@pytest.mark.slow  # draws a panel: matplotlib's import alone is about a second
def test_values_no_axis_can_hold_are_gaps_said_under_the_panel_not_a_traceback():
    """A grad norm of 1e308 made matplotlib's tick locator fail ("arange: cannot compute length")."""
    from sftdoctor.report.panels import Axis, render, undrawn

    run = PlottedRun(
        {"series": {"grad_norm": {"steps": [1, 2, 3], "values": [1e308, float("nan"), 1e308]}}}, [], "r", "#000", []
    )
    [panel] = shown([run])
    assert render(panel, [run], Axis("step"))[:8] == b"\x89PNG\r\n\x1a\n"
    assert undrawn(panel, [run]) == "not drawn: grad_norm of r at 3 steps (NaN, inf or beyond \u00b11e300)"
