"""The error a stage launch raises for settings it cannot run as asked."""


class LaunchError(ValueError):
    """A stage's settings cannot be launched as asked; the message says what to change."""
