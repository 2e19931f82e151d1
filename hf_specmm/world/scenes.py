"""Seeded synthetic scenes (a few coloured shapes on a 3 × 3 grid) and their deterministic rendering.

Example::

    >>> import random
    >>> from hf_specmm.world.scenes import sample_scene, render, png_bytes
    >>> scene = sample_scene(random.Random(0))
    >>> image = render(scene, size=64)
    >>> image.size
    (64, 64)
    >>> png_bytes(image) == png_bytes(render(scene, size=64))
    True
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
PLURALS: dict[str, str] = {"circle": "circles", "square": "squares", "triangle": "triangles"}
COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "black", "white")
SIZES: tuple[str, ...] = ("small", "large")
ROWS: tuple[str, ...] = ("top", "middle", "bottom")
COLUMNS: tuple[str, ...] = ("left", "center", "right")
CELLS: tuple[tuple[str, str], ...] = tuple((r, c) for r in ROWS for c in COLUMNS)

BACKGROUND: tuple[int, int, int] = (128, 128, 128)
RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (250, 220, 0),
    "black": (0, 0, 0),
    "white": (255, 255, 255),
}
_RADIUS = {"small": 0.22, "large": 0.42}  # fraction of a grid cell


@dataclass(frozen=True)
class SceneObject:
    """One shape: ``shape`` ∈ SHAPES, ``colour`` ∈ COLOURS, ``size`` ∈ SIZES, cell (``row``, ``column``)."""

    shape: str
    colour: str
    size: str
    row: str
    column: str

    def __post_init__(self) -> None:
        for value, allowed in ((self.shape, SHAPES), (self.colour, COLOURS), (self.size, SIZES),
                               (self.row, ROWS), (self.column, COLUMNS)):
            if value not in allowed:
                raise ValueError(f"{value!r} is not one of {allowed}")

    @property
    def position(self) -> str:
        """Position words, e.g. ``"top left"`` or ``"middle center"``."""
        return f"{self.row} {self.column}"


@dataclass
class Scene:
    """A list of objects, at most one per grid cell, kept in reading order (row, then column)."""

    objects: list[SceneObject] = field(default_factory=list)

    def __post_init__(self) -> None:
        cells = [(o.row, o.column) for o in self.objects]
        if len(set(cells)) != len(cells):
            raise ValueError("two objects share a grid cell")
        self.objects = sorted(self.objects, key=lambda o: CELLS.index((o.row, o.column)))

    def count(self, shape: str | None = None, colour: str | None = None) -> int:
        """Number of objects matching ``shape`` and/or ``colour`` (None matches anything)."""
        return sum(1 for o in self.objects
                   if (shape is None or o.shape == shape) and (colour is None or o.colour == colour))


def sample_scene(rng: random.Random, max_objects: int = 3) -> Scene:
    """A scene with 1..``max_objects`` objects in distinct cells, drawn only from ``rng``.

    >>> sample_scene(random.Random(1), max_objects=1).objects[0].shape in SHAPES
    True
    """
    if not 1 <= max_objects <= len(CELLS):
        raise ValueError(f"max_objects must be in 1..{len(CELLS)}, got {max_objects}")
    n = rng.randint(1, max_objects)
    cells = rng.sample(CELLS, n)
    return Scene([SceneObject(rng.choice(SHAPES), rng.choice(COLOURS), rng.choice(SIZES), r, c)
                  for r, c in cells])


def render(scene: Scene, size: int = 64) -> Image.Image:
    """Draw ``scene`` on a plain grey RGB square of ``size`` pixels (no anti-aliasing: deterministic).

    >>> render(Scene(), size=8).getpixel((0, 0))
    (128, 128, 128)
    """
    image = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cell = size / 3
    for o in scene.objects:
        cx = round((COLUMNS.index(o.column) + 0.5) * cell)
        cy = round((ROWS.index(o.row) + 0.5) * cell)
        r = max(1, round(_RADIUS[o.size] * cell))
        fill = RGB[o.colour]
        if o.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        elif o.shape == "square":
            draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
        else:
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    return image


def png_bytes(image: Image.Image) -> bytes:
    """PNG encoding with fixed settings (no metadata, fixed compression), so equal images give equal bytes.

    >>> png_bytes(render(Scene(), size=8))[:4]
    b'\\x89PNG'
    """
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()
