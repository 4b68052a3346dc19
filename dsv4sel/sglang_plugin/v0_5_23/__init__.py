"""SGLang 0.5.23's release folder: its host translation ``sglang-0.5.23.yaml`` (SGLang's inputs in
the rules' words, proven complete over SGLang's space by ``dsv4sel check``). The plugin's code reads
SGLang through hooks that have one shape in every release it supports, so it is written once, in
:mod:`dsv4sel.sglang_plugin`; a release whose hooks differ puts its own reader here."""
