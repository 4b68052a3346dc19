"""Package discovery only; everything else is declared in pyproject.toml.

pyproject.toml's ``packages.find`` cannot discover packages that
``package-dir`` maps from other folders, so setuptools finds them here:
``dsv4sel/`` as it lies, ``kernels/`` as ``dsv4sel.kernels``, and ``rules/``
as the data package ``dsv4sel.rules`` (its YAML, subfolders included, is
package data). A new subpackage therefore ships without editing a list.
"""

import os
import subprocess
import sys

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

_SKIP = ["*__pycache__*", "*.egg-info*"]

# Run in a child process against the built tree (not an installed or editable
# dsv4sel): the artifact is compiled from exactly the files the wheel ships.
_COMPILE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in (getattr(f, "__module__", "") or "")]
sys.path.insert(0, sys.argv[1])
import dsv4sel.api as api
assert api.__file__.startswith(sys.argv[1]), api.__file__
print(api.write_shipped_artifact(sys.argv[2]))
"""


class BuildWithCompiledRules(build_py):
    """build_py, then the shipped rules' compiled form (``dsv4sel/shipped.dsv4c``)
    written into the built package, so an installed ``select()`` reads it
    from the package instead of a user-writable cache. An editable install
    skips it (``make run`` writes the checkout's)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = os.path.join(self.build_lib, "dsv4sel", "shipped.dsv4c")
        env = {**os.environ, "DSV4SEL_NO_CACHE": "1", "DSV4SEL_RULES_PATH": ""}
        subprocess.run([sys.executable, "-c", _COMPILE, os.path.abspath(self.build_lib), target],
                       check=True, env=env, stdout=subprocess.DEVNULL)


setup(cmdclass={"build_py": BuildWithCompiledRules}, packages=[
    *find_namespace_packages(include=["dsv4sel", "dsv4sel.*"], exclude=_SKIP),
    "dsv4sel.kernels",
    *("dsv4sel.kernels." + p for p in find_namespace_packages("kernels", exclude=_SKIP)),
    "dsv4sel.rules",
    # folders of rules/ (rule sets such as compat/) hold data only, but setuptools
    # treats every importable folder as a package and warns unless it is listed
    *("dsv4sel.rules." + p for p in find_namespace_packages("rules", exclude=_SKIP)),
])
