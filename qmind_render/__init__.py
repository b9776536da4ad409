"""A notebook-first research workbook: can a diffusion model render a game?

Modules:

- `qmind_render.assets.watchdog`: The instance watchdog: spot interruptions and idle GPUs."""

__version__ = "0.1.0"
