"""HEMRA: evaluate AI coding-agent harnesses on datasets of tasks, as a pytest plugin."""

__version__ = "0.1.0"
