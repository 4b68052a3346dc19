"""Package discovery only; everything else is declared in pyproject.toml.

pyproject.toml's ``packages.find`` cannot discover packages that
``package-dir`` maps from other folders, so setuptools finds them here:
``dsv4sel/`` as it lies, ``kernels/`` as ``dsv4sel.kernels``, and ``rules/``
as the data package ``dsv4sel.rules`` (its YAML, subfolders included, is
package data). A new subpackage therefore ships without editing a list.
"""

from setuptools import find_namespace_packages, setup

_SKIP = ["*__pycache__*", "*.egg-info*"]

setup(packages=[
    *find_namespace_packages(include=["dsv4sel", "dsv4sel.*"], exclude=_SKIP),
    "dsv4sel.kernels",
    *("dsv4sel.kernels." + p for p in find_namespace_packages("kernels", exclude=_SKIP)),
    "dsv4sel.rules",
    # folders of rules/ (rule sets such as compat/) hold data only, but setuptools
    # treats every importable folder as a package and warns unless it is listed
    *("dsv4sel.rules." + p for p in find_namespace_packages("rules", exclude=_SKIP)),
])
