"""Rule-file text the tests build packs from (one definition, so a change of
the format is one edit)."""

#: The head of a backend table on FlashMLA's V4 defaults, up to ``rules:``;
#: ``{name}`` is the backend. Append rules indented by two spaces.
BACKEND_HEAD = """\
kind: backend
backends: [{name}]
hit_policy: first
defaults:
  impl: dsv4sel.kernels.flashmla:DeepseekV4FlashMLASparseImpl
  layout: fp8_ds_mla
  cache_dtype: fp8_ds_mla
  torch_dtype: uint8
  bytes_per_token: 584
  block_size: 256
rules:
"""


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
