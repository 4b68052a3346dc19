"""``dsv4sel check``: the exact, point-free verifier of a compiled program."""
