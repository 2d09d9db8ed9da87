"""Metric curves: a series of one logged point is drawn as a marker (a line through one point is
invisible) on axes around it, a longer one as a plain line; every (run, metric) series has its own
colour and the legend sits beside the axes, not on the data; the PNG is written through
``atomic_write`` (``savefig`` into the temporary path with an explicit format); a title too long for
the axes is wrapped to stay inside the figure; ``save_png``, the benchmarks' plots' writer, keeps an earlier
file whole when ``savefig`` fails."""

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
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


def test_a_long_title_is_wrapped_inside_the_figure(tmp_path, monkeypatch):
    # The sandbox's accuracy title beside a legend of long labels: centred on the narrowed axes, one line
    # would start left of the figure.
    drawn = capture(monkeypatch)
    frame = pd.DataFrame({"eval/acc_mean": [0.3, 0.4]}, index=pd.Index([0, 20], name="step"))
    title = (
        "Held-out greedy accuracy, mean over levels (band: ± std over seeds; no training: the warmed-up policy's "
        "step-0 accuracy)"
    )
    plot_metrics({"avspo:paper_code": frame, "no training": frame}, ["eval/acc_mean"], tmp_path / "a.png", title, "y")
    ((figure, _, _),) = drawn
    box = figure.axes[0].title.get_window_extent(FigureCanvasAgg(figure).get_renderer())
    assert figure.axes[0].get_title().count("\n") >= 1
    assert 0 <= box.x0 and box.x1 <= figure.bbox.width and box.y1 <= figure.bbox.height


def test_save_png_never_leaves_half_a_plot(tmp_path):
    # A benchmark's plot goes through the same atomic write: a failing savefig keeps the earlier file as it
    # was and leaves no temporary beside it; a good one writes a PNG, creating the folder.
    from verl_avspo.tools.plots import save_png

    figure = Figure()
    figure.add_subplot().plot([0, 1], [0, 1])
    path = save_png(figure, tmp_path / "new" / "curve.png", dpi=50)
    assert path.read_bytes().startswith(b"\x89PNG")
    earlier = path.read_bytes()
    broken = Figure()
    broken.savefig = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("disk full"))
    with pytest.raises(RuntimeError, match="disk full"):
        save_png(broken, path, dpi=50)
    assert path.read_bytes() == earlier and sorted(p.name for p in path.parent.iterdir()) == ["curve.png"]
