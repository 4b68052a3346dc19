"""The generic decision-table engine: sources, load, validate, compile, the
compiled artifact and its evaluation. It knows no domain: what the inputs and
select fields mean is handed to it as a :class:`~dsv4sel.engine.profile.Profile`."""
