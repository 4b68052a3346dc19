"""The version, in a module of its own: every layer may read it without
importing the package face (``dsv4sel/__init__``), which sits above them."""

__version__ = "0.1.0"
