"""Rule files the tests derive from the shipped ones at test time (the rule files a test
uses as they are live beside it, as YAML: ``tests/<package>/rules/``, ``tests/rules/``)."""


def edited_shipped_rules(into) -> str:
    """Copy the shipped rules to ``into`` (a ``pathlib.Path``) with one edit:
    SM12x defaults to FlashMLA instead of FlashInfer. Returns the copy's path."""
    import shutil
    from pathlib import Path

    shutil.copytree(Path(__file__).resolve().parent.parent / "rules", into)
    path = into / "defaults.yaml"
    text = path.read_text()
    edited = text.replace("capability: 12.x}\n    use: FLASHINFER_MLA_SPARSE_DSV4",
                          "capability: 12.x}\n    use: FLASHMLA_SPARSE_DSV4")
    assert edited != text, "the shipped default decision no longer reads as this edit expects"
    path.write_text(edited)
    return str(into)
