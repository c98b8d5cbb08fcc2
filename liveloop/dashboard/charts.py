"""Charts as inline SVG, drawn on the server: no script, no library, and the page's table beside each
chart carries the same values as text (the chart itself is ``aria-hidden``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT, PAD = 480, 160, 28


def line_chart(title: str, points: Sequence[tuple[str, float | None]]) -> Markup:
    """A line through ``(label, value)`` points in order; a None value leaves a gap. Empty input: a note."""
    values = [v for _, v in points if v is not None and math.isfinite(v)]
    if not values:
        return Markup('<p class="muted">No values yet for {}.</p>').format(title)
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 1, high + 1  # a flat line sits in the middle, not on an edge
    step = (WIDTH - 2 * PAD) / max(len(points) - 1, 1)

    def y(value: float) -> float:
        return HEIGHT - PAD - (value - low) / (high - low) * (HEIGHT - 2 * PAD)

    path: list[str] = []
    dots: list[str] = []
    pen_up = True
    for i, (label, value) in enumerate(points):
        if value is None or not math.isfinite(value):
            pen_up = True
            continue
        x = PAD + i * step
        path.append(f"{'M' if pen_up else 'L'}{x:.1f},{y(value):.1f}")
        pen_up = False
        dots.append(
            f'<circle cx="{x:.1f}" cy="{y(value):.1f}" r="3"><title>{escape(label)}: {value:.4g}</title></circle>'
        )
    labels = "".join(
        f'<text x="{PAD + i * step:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{escape(label)}</text>'
        for i, (label, _) in enumerate(points)
        if len(points) <= 12 or i % math.ceil(len(points) / 12) == 0
    )
    svg = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-hidden="true" '
        f'preserveAspectRatio="xMidYMid meet"><title>{escape(title)}</title>'
        f'<text x="{PAD}" y="14">{escape(title)}: {low:.3g} to {high:.3g}</text>'
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" class="axis"/>'
        f'<path d="{" ".join(path)}" fill="none"/>{"".join(dots)}{labels}</svg>'
    )
    return Markup(svg)  # noqa: S704 (every text in it went through html.escape)
