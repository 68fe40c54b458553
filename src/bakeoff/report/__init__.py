"""Report artifacts: plots (PNG) and HTML pages for ``snakemake --report`` and MLflow."""
