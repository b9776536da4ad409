"""A notebook-first research workbook: can a diffusion model render a game?

Modules:

- `qmind_render.assets.watchdog`: The instance watchdog: hand a spot interruption to the trainer, and end a job whose GPU sits idle."""

__version__ = "0.1.0"
