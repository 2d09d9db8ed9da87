"""Metric curves: a series of one logged point is drawn as a marker (a line through one point is
invisible) on axes around it, a longer one as a plain line; every (run, metric) series has its own
colour and the legend sits beside the axes, not on the data; the PNG is written through
``atomic_write`` (``savefig`` into the temporary path with an explicit format)."""

import pandas as pd
from matplotlib.figure import Figure

from verl_avspo.tools.plots import plot_metrics


def capture(monkeypatch) -> list[tuple[Figure, tuple, dict]]:
    drawn: list[tuple[Figure, tuple, dict]] = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: drawn.append((figure, args, kwargs)))
    return drawn


def test_a_one_point_series_draws_a_marker(tmp_path, monkeypatch):
    drawn = capture(monkeypatch)
    one = pd.DataFrame({"acr/rate": [0.4]}, index=pd.Index([7], name="step"))
    two = pd.DataFrame({"acr/rate": [0.4, 0.5]}, index=pd.Index([1, 2], name="step"))
    plot_metrics({"one": one, "two": two}, ["acr/rate"], tmp_path / "acr.png", "ACR", "rate")
    ((figure, _, _),) = drawn
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    assert lines["one"].get_marker() == "o" and list(lines["one"].get_xdata()) == [7]
    assert lines["two"].get_marker() in (None, "None", "")


def test_a_lone_point_gets_readable_axes(tmp_path, monkeypatch):
    drawn = capture(monkeypatch)
    one = pd.DataFrame({"reward": [0.37]}, index=pd.Index([10], name="step"))
    plot_metrics({"run": one}, ["reward"], tmp_path / "reward.png", "Reward", "score")
    ((figure, _, _),) = drawn
    low, high = figure.axes[0].get_ylim()
    assert high - low >= 0.5 and low < 0.37 < high  # not matplotlib's 0.33-0.41
    left, right = figure.axes[0].get_xlim()
    assert left < 10 < right and right - left >= 2


def test_every_series_has_its_own_colour_and_the_legend_is_off_the_data(tmp_path, monkeypatch):
    drawn = capture(monkeypatch)
    steps = pd.Index(range(1, 6), name="step")
    functions = [f"rewards/f{i}/mean" for i in range(12)]
    frame = pd.DataFrame({column: [0.1 * i] * 5 for i, column in enumerate(functions)}, index=steps)
    path = plot_metrics({"run": frame}, functions, tmp_path / "reward_functions.png", "Functions", "reward")
    ((figure, args, kwargs),) = drawn
    lines = figure.axes[0].get_lines()
    assert len({line.get_color() for line in lines}) == 12
    assert [line.get_label() for line in lines] == functions  # one run: the legend names the metrics only
    anchor = figure.axes[0].get_legend().get_bbox_to_anchor().transformed(figure.axes[0].transAxes.inverted())
    assert anchor.x0 > 1.0  # right of the axes
    # Written to a temporary path beside the target, in an explicit format, then renamed into place.
    assert kwargs["format"] == "png" and args[0] != path and args[0].parent == path.parent
