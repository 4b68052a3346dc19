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
