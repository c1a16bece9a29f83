"""Every picture of the tiny run (pipeline/plots.py, through the report stage's `write_report`) with its titles,
axis labels and legends inside the figure: each is checked against the figure's box as it is saved, with a run title
as long as a real one's."""

import matplotlib.figure
import pytest
from matplotlib.image import AxesImage

from pipeline.report import write_report
from tests.test_prototype import _results

LONG = "Mamba-FSCIL: mamba_fscil_plus on synthetic_quick, seed 0 (dual_ssm projector)"


def text_outside(fig) -> list[str]:
    """The titles, axis labels and legend entries of `fig` that reach beyond its box, as laid out when saved."""
    fig.canvas.draw()  # the layout as saved
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [t for t in (fig._suptitle,) if t is not None]
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        texts += ax.get_legend().get_texts() if ax.get_legend() else []
    outside = []
    for text in texts:
        if not text.get_visible() or not text.get_text().strip():
            continue
        extent = text.get_window_extent(renderer)
        if extent.x0 < box.x0 - 1 or extent.y0 < box.y0 - 1 or extent.x1 > box.x1 + 1 or extent.y1 > box.y1 + 1:
            outside.append(text.get_text())
    return outside


def test_every_picture_keeps_its_text_inside_the_figure(tiny_run, tmp_path, monkeypatch):
    import numpy as np

    _, _, paths = tiny_run
    saved, outside, scales = [], [], []
    save = matplotlib.figure.Figure.savefig

    def checked(fig, target, *args, **kwargs):
        outside.extend((str(target), text) for text in text_outside(fig))
        saved.append(fig.get_size_inches() * fig.dpi)
        scales.extend((image.norm.vmax, float(image.get_array().max())) for image in fig.findobj(AxesImage))
        return save(fig, target, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", checked)
    arrays = dict(np.load(paths.session(3) / "diagnostics.npz"))
    write_report(_results(paths), tmp_path / "metrics.json", tmp_path / "report", LONG, arrays)
    assert len(saved) == 5  # accuracy, diagnostics, z_histogram, tsne, b_maps
    assert outside == [], outside
    assert max(height for _, height in saved) <= 1300  # pictures sized to their content
    # b_maps: each panel on its own colour scale (g_inc's norms are far below g_base's)
    assert scales and all(vmax == pytest.approx(top) for vmax, top in scales), scales
