"""The version and the project's published documentation, in a module of its own: every layer
may read them without importing the package face (``dsv4sel/__init__``), which sits above them."""

__version__ = "0.1.0"
#: The project's docs tree as published (pyproject.toml's ``Documentation`` URL): messages and
#: help name a page as ``f"{DOCS_URL}/cli.md"``, since a wheel carries no ``docs/`` folder.
DOCS_URL = "https://github.com/dsv4sel/dsv4sel/blob/main/docs"
