"""The vLLM host suite, written once for every vLLM release dsv4sel supports.

Two kinds of module live here:

- run by pytest (the project's venv): :mod:`harness.releases` (the release record each release
  folder declares), :mod:`harness.runner` (the vLLM processes, started together on one bounded
  pool), :mod:`harness.limits` (their time limits), and the release-independent tests
  (``*_tests.py``) that each release folder's test files import and so run for that release, and
  :mod:`harness.zygote`'s client (a release's processes are forked from one process that imported
  torch and transformers once);
- run inside a release's own vLLM environment, by path: :mod:`stubs` (hardware stand-ins; a
  release folder's ``stubs.py`` adds what that release needs), :mod:`oracle` and :mod:`layers`
  (vLLM's own decision, each chosen layer built whole), :mod:`differential`, :mod:`hostcheck`,
  :mod:`plugin_scenarios`, :mod:`serve`, :mod:`extra_resolve` and the zygote itself. They import no pytest and
  find their release from the installed vLLM's version (:mod:`release_stubs`).

A release folder (``v0_33/``, ``v0_34/``) holds only what differs: its record (``__init__.py``),
its test files (the harness's tests plus the figures that pin that release) and its stubs.
"""
