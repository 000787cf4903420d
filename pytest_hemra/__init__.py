"""HEMRA: evaluate AI coding-agent harnesses on datasets of tasks, as a pytest plugin."""

__version__ = "0.1.0"
# where the docs are read online (pyproject.toml's [project.urls] Documentation; tested equal)
DOCS_URL = "https://github.com/pytest-hemra/pytest-hemra/blob/main/docs"
