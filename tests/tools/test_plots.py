"""Metric curves: a series of one logged point is drawn as a marker (a line through one point is
invisible), a longer one as a plain line."""

import pandas as pd
from matplotlib.figure import Figure

from verl_avspo.tools.plots import plot_metrics


def test_a_one_point_series_draws_a_marker(tmp_path, monkeypatch):
    drawn: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: drawn.append(figure))
    one = pd.DataFrame({"acr/rate": [0.4]}, index=pd.Index([7], name="step"))
    two = pd.DataFrame({"acr/rate": [0.4, 0.5]}, index=pd.Index([1, 2], name="step"))
    plot_metrics({"one": one, "two": two}, ["acr/rate"], tmp_path / "acr.png", "ACR", "rate")
    (figure,) = drawn
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    assert lines["one"].get_marker() == "o" and list(lines["one"].get_xdata()) == [7]
    assert lines["two"].get_marker() in (None, "None", "")
