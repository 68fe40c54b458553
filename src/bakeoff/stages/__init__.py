"""One module per DAG stage. Each Snakemake rule runs exactly one of these
through the ``bakeoff`` CLI, so the rule bodies stay wiring only."""
