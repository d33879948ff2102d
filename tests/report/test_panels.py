"""The panels (report/panels.py): thinning long series, which panels a run gets."""

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
