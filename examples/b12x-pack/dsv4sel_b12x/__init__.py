"""Example dsv4sel rule pack for the B12X_MLA_SPARSE fork backend."""
