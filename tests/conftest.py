import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test compiles into its own cache dir, so no test depends on another's cache."""
    monkeypatch.setenv("DSV4SEL_CACHE_DIR", str(tmp_path_factory.mktemp("dsv4sel-cache")))


@pytest.fixture
def write_rules(tmp_path, monkeypatch):
    """Write ``{name: text}`` rule files into ``rules/`` of a fresh working
    directory (so messages name them ``rules/NAME``) and return its path."""
    monkeypatch.chdir(tmp_path)

    def write(files: dict[str, str]) -> str:
        directory = tmp_path / "rules"
        directory.mkdir(exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
        return str(directory)

    return write

