"""HEMRA: evaluate AI coding-agent harnesses on datasets of tasks, as a pytest plugin.

PYTEST_DONT_REWRITE: pytest marks a plugin's package for assertion rewriting when its session
starts, and warns when the package is already imported, as it is under `hemra` (whose command
line is this package). Nothing here is a test module whose asserts need rewriting.
"""

__version__ = "0.1.0"
# where the docs are read online (pyproject.toml's [project.urls] Documentation; tested equal)
DOCS_URL = "https://github.com/pytest-hemra/pytest-hemra/blob/main/docs"
