"""A rule pack's own code (test data): its vLLM layer lives in :mod:`ownlayer_pack.layer`."""
