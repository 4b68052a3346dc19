"""Every problem and finding has a stable code (dsv4sel.engine.codes): each code is held
here to a real rule file that produces it, through the real pipeline; and each code's
wording is pinned once, in ``wording.yaml`` beside this file (every other test asserts
codes and locations, not text)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.engine.codes import CODES, kind_code
from dsv4sel.engine.load import load_file
from dsv4sel.engine.sources import default_packs
from dsv4sel.errors import Loc

from _repo import REPO

TESTS = Path(__file__).resolve().parent.parent
#: this file's rule sets, one folder per test
RULES = Path(__file__).with_name("rules") / "codes"
#: the small vocabulary and default decision (everything to backend A) many tests build on
SMALL = TESTS / "rules" / "small"


def gather(into: Path, *folders: Path) -> str:
    """Copy the rule files of ``folders`` into ``into`` (a later file replaces one of the same name)."""
    for folder in folders:
        shutil.copytree(folder, into, dirs_exist_ok=True)
    return str(into)


def codes_of(report):
    return [(f.file.rsplit("/", 1)[-1], f.code) for f in report.findings]


def found(report):
    return [(f.code, str(f.loc)) for f in report.findings]


def test_load_and_schema_codes():
    report = dsv4sel.verify([*default_packs(), str(RULES / "load_and_schema")])
    got = dict(codes_of(report))
    assert got == {
        "a_syntax.yaml": "DSV102", "b_empty.yaml": "DSV103", "c_tag.yaml": "DSV104",
        "e_dup.yaml": "DSV106", "f_unquoted.yaml": "DSV202", "g_unknown_field.yaml": "DSV203",
        "h_required.yaml": "DSV204", "i_enum.yaml": "DSV201",
    }, [str(f) for f in report.findings]
    assert len(report.findings) == len(got), [str(f) for f in report.findings]  # one finding per problem


def test_compile_codes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = dsv4sel.verify([*default_packs(), gather(tmp_path / "rules", RULES / "compile")])
    assert found(report) == [
        ("DSV305", "rules/vocab.yaml:3:3"), ("DSV301", "rules/x.yaml:13:26"), ("DSV302", "rules/x.yaml:16:10"),
        ("DSV303", "rules/x.yaml:19:22"), ("DSV304", "rules/x.yaml:22:20"), ("DSV307", "rules/x.yaml:23:7"),
        ("DSV309", "rules/x.yaml:25:3"), ("DSV311", "rules/x.yaml:26:8"), ("DSV308", "rules/y.yaml:2:12"),
        ("DSV310", "rules/y.yaml:5:9")], [str(f) for f in report.findings]


def test_a_copied_pack_file_is_one_problem(tmp_path):
    pack = tmp_path / "copy"
    pack.mkdir()
    shutil.copy(os.path.join(REPO, "rules", "flashmla.yaml"), pack / "flashmla.yaml")
    report = dsv4sel.verify([*default_packs(), str(pack)])
    # located at the copy's first line of data (the shipped file opens with comments)
    assert [(f.code, f.file) for f in report.findings] == [("DSV313", str(pack / "flashmla.yaml"))], \
        [str(f) for f in report.findings]


def test_verification_codes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = dsv4sel.verify([gather(tmp_path / "rules", SMALL, RULES / "verification")])
    assert found(report) == [
        ("DSV401", "rules/a.yaml:2"), ("DSV401", "rules/a.yaml:2"), ("DSV402", "rules/a.yaml:12"),
        ("DSV405", "rules/a.yaml:18"), ("DSV403", "rules/b.yaml:12"), ("DSV404", "rules/b.yaml:14"),
        ("DSV404", "rules/b.yaml:17")], [str(f) for f in report.findings]
    for f in report.findings:
        assert f.to_dict()["code"] == f.code and f" {f.code} [{f.kind}] " in str(f)


def test_a_table_that_never_tests_model_is_a_warning_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rules = gather(tmp_path / "rules", SMALL, RULES / "two_models")  # models m and m2; A never tests model
    report = dsv4sel.verify([rules])
    assert [(f.code, f.severity, str(f.loc)) for f in report.findings] == [("DSV410", "warning", "rules/a.yaml:2")]
    # with the guard the message proposes, the warning goes
    gather(tmp_path / "rules", RULES / "two_models_guarded")
    assert dsv4sel.verify([rules]).ok


def test_a_shadowed_pack_default_says_override():
    report = dsv4sel.verify([*default_packs(), str(RULES / "quiet_default")])
    (f,) = report.findings
    assert (f.code, f.line, [r.id for r in f.rules][:1]) == ("DSV404", 4, ["quiet-default"])
    # the fix it names is the rule's own: `override: true` (the wording is pinned in wording.yaml)
    assert f.message.endswith("give quiet-default `override: true`")


def test_every_code_is_documented_and_classified():
    assert all(code.startswith("DSV") and len(code) == 6 for code in CODES)
    assert kind_code("gap") == "DSV401" and kind_code("impl") == "DSV406"
    docs = (Path(REPO) / "docs" / "cli.md").read_text()
    for code in CODES:
        assert code in docs, code


def test_codes_are_set_where_problems_are_found_not_read_from_their_text():
    # a message that reads like another kind of problem keeps its own code
    from dsv4sel.engine.load import load_text

    text = (RULES / "reads_like_another_problem" / "t.yaml").read_text()  # kind: "duplicate key", twice
    _, problems = load_text(text, "t.yaml")
    assert [(p.code, p.line) for p in problems] == [("DSV106", 2)]


def test_a_test_file_among_the_rules_is_one_problem():
    report = dsv4sel.verify([*default_packs(), str(RULES / "test_file_among_rules")])
    assert [(f.code, f.line) for f in report.findings] == [("DSV501", 1)], [str(f) for f in report.findings]


def test_selection_codes():
    report = dsv4sel.verify([*default_packs(), str(RULES / "selection")])
    by_rule = {f.rules[0].id: f.code for f in report.findings if f.code != "DSV412"}
    assert by_rule == {"z-noimpl": "DSV406", "z-layout": "DSV407", "z-size": "DSV408", "z-rewrite": "DSV409"}, \
        [str(f) for f in report.findings]
    # and, as the pack names no vLLM class, one DSV412 warning at its first select rule
    (hostless,) = [f for f in report.findings if f.code == "DSV412"]
    assert (hostless.severity, hostless.rules[0].id, hostless.table) == ("warning", "z-noimpl", "Z_DSV4")


def test_a_use_cycle_is_dsv312():
    report = dsv4sel.verify([*default_packs(), str(RULES / "use_cycle")])
    assert [(f.code, f.line) for f in report.findings] == [("DSV312", 2)], [str(f) for f in report.findings]


# ------------------------------------------------------------------ each code's wording, once

def _wording() -> dict:
    # read by dsv4sel's own loader: a code given twice is a duplicate key, refused
    loaded, problems = load_file(str(Path(__file__).with_name("wording.yaml")), "wording.yaml")
    assert loaded is not None and not problems, problems
    return loaded.data


TABLE = _wording()
#: code -> the test file (under tests/) that pins its wording instead of this table
ELSEWHERE: dict[str, str] = TABLE.get("elsewhere", {})
#: key -> entry: the wording this table pins
WORDING = {key: entry for key, entry in TABLE.items() if key != "elsewhere"}


def test_the_wording_table_names_real_codes_only():
    # a key is a code, or a code and the variant of its message (`DSV501 test file`)
    codes = {key.split()[0] for key in WORDING}
    assert codes <= set(CODES), sorted(codes - set(CODES))
    assert set(ELSEWHERE) <= set(CODES), sorted(set(ELSEWHERE) - set(CODES))


def test_every_code_s_wording_is_pinned_once():
    """Each code of the table of codes has its wording pinned: an entry of wording.yaml, or a
    line of its `elsewhere:` naming the test file that pins it (which must exist and name the
    code), never both."""
    here = {key.split()[0] for key in WORDING}
    unpinned = [code for code in CODES if code not in here and code not in ELSEWHERE]
    assert not unpinned, f"no wording pin for {unpinned}: add an entry to wording.yaml, or name the test that pins it under `elsewhere:`"
    twice = sorted(here & set(ELSEWHERE))
    assert not twice, f"pinned both in wording.yaml and elsewhere: {twice}"
    for code, name in ELSEWHERE.items():
        path = TESTS / name
        assert path.is_file(), f"{code}: {name} does not exist"
        assert code in path.read_text(), f"{code}: {name} does not mention {code}"


def test_dsv399_is_only_the_fallback():
    # DSV399 is internal, never a stage's: the code of a RuleError without problems and of a
    # finding kind the table of codes lacks (mypy's Kind holds every kind, so neither happens)
    assert kind_code("no such kind") == "DSV399"  # type: ignore[arg-type]
    setters = [path.relative_to(REPO).as_posix() for path in sorted(Path(REPO, "dsv4sel").rglob("*.py"))
               if "DSV399" in path.read_text()]
    assert setters == ["dsv4sel/engine/codes.py", "dsv4sel/errors.py"], setters


def _items(entry: dict, tmp_path: Path, monkeypatch):
    """The problems or findings of one entry's input, in a fresh working directory ``tmp_path``."""
    if "host_site" in entry:  # a folder where the host's distribution is installed (its metadata only)
        monkeypatch.syspath_prepend(str(TESTS / entry["host_site"]))
    if "cases" in entry:  # `dsv4sel test`'s failures, as its --format github and sarif give them
        from dsv4sel.cli.render.test import diagnostics
        from dsv4sel.tools.testcases import load_cases, run_tests

        for name in entry["cases"]:
            shutil.copy(TESTS / name, tmp_path / Path(name).name)
        cases, files = load_cases([Path(name).name for name in entry["cases"]])
        return diagnostics(run_tests(dsv4sel.default_rules(), cases, files=files))
    if "deployment" in entry:  # `dsv4sel fleet`'s problems with a deployment file, named as given
        from dsv4sel.tools.deployment import DeploymentError, load_deployment
        from dsv4sel.tools.fleet import decide_fleet

        name = Path(entry["deployment"]).name
        shutil.copy(TESTS / entry["deployment"], tmp_path / name)
        with pytest.raises(DeploymentError) as info:
            decide_fleet(load_deployment(name), dsv4sel.default_rules(), entry.get("as", "dsv4sel"))
        return info.value.problems
    if "test_files" in entry:  # `dsv4sel test`'s problems with test files, named as given
        from dsv4sel.tools.testcases import TestFileError, load_cases

        for name in entry["test_files"]:
            shutil.copy(TESTS / name, tmp_path / Path(name).name)
        for name in entry.get("empty_dirs", ()):
            (tmp_path / name).mkdir()
        paths = [*(Path(n).name for n in entry["test_files"]), *entry.get("missing", ()), *entry.get("empty_dirs", ())]
        with pytest.raises(TestFileError) as info:
            load_cases(paths)
        return info.value.problems
    rules = gather(tmp_path / "rules", *(TESTS / folder for folder in entry["rules"]))
    for name in entry.get("empty_dirs", ()):  # packs named by a directory without rule files
        (tmp_path / name).mkdir()
    paths = [*(default_packs() if entry.get("shipped") else []),
             *([rules + "/" + name for name in entry["missing"]] if "missing" in entry else [rules]),
             *entry.get("empty_dirs", ())]
    try:  # a rule set that does not compile has problems; one that does, findings
        dsv4sel.load_rules(paths, use_cache=False)
    except dsv4sel.RuleError as error:
        return error.problems
    return dsv4sel.verify(paths).findings


def _at(item) -> str:
    """Where a problem, finding or `dsv4sel test` diagnostic is, as ``file:line[:column]``."""
    loc = getattr(item, "loc", None)
    return str(loc if loc is not None else Loc(item.file, item.line, item.column))


@pytest.mark.parametrize("key", sorted(WORDING))
def test_each_code_s_wording(key, tmp_path, monkeypatch):
    """The message of a code as a user reads it, from the input the table names: ``rules``,
    folders under tests/ copied in order into ``rules/``, or ``test_files`` (under tests/) copied
    beside it, or ``cases`` (test files run against the shipped rules), or ``deployment`` (a
    deployment file decided as ``dsv4sel fleet`` decides it), in a fresh working
    directory, with ``host_site`` (a folder under tests/) on sys.path; at the place the table gives."""
    entry = WORDING[key]
    monkeypatch.chdir(tmp_path)
    items = _items(entry, tmp_path, monkeypatch)
    hits = [f for f in items if f.code == key.split()[0] and _at(f) == entry["at"]]
    assert hits, [str(f) for f in items]
    assert entry["says"] in hits[0].message, hits[0].message



@pytest.mark.parametrize(("key", "code"), [("<<", "DSV105"), ("!!merge <<", "DSV105"), ('"<<"', "DSV203")])
def test_a_merge_key_is_refused_however_it_is_spelt_and_a_quoted_one_is_a_key(key, code, tmp_path, monkeypatch):
    # A plain `<<` is what users write after reading about YAML anchors; the core schema the
    # loader reads would take it for an ordinary key, so it is refused as a merge key too.
    monkeypatch.chdir(tmp_path)
    source = (RULES / "merge_key" / "m.yaml").read_text()
    assert "      <<: *fp8" in source
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "m.yaml").write_text(source.replace("<<: *fp8", f"{key}: *fp8"))
    report = dsv4sel.verify([gather(tmp_path / "rules", SMALL)])
    assert [(f.code, str(f.loc)) for f in report.findings if f.code in ("DSV105", "DSV203")] == \
        [(code, "rules/m.yaml:17:7")], [str(f) for f in report.findings]
