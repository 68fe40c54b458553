# MLflow: one job, after the summary and plots, logs the whole invocation (parent run + one run per cell).
# A single writer (plus a file lock in bakeoff.results.tracking) keeps the sqlite store consistent under parallel jobs.


rule track:
    input:
        summary=SUMMARY,
        config=POINTS_FILE,
        versions=VERSIONS,
        cells=cell_indexes(),
        plots=plot_files(),
    output:
        TRACKED,
    params:
        uri=CFG.tracking.uri,
        experiment=CFG.tracking.experiment,
    log:
        "logs/results/mlflow/runs.log",
    benchmark:
        "logs/bench/results/mlflow/runs.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff track {input.cells} --summary {input.summary} --config {input.config} --versions {input.versions}"
        " --plots {input.plots} --uri {params.uri:q} --experiment {params.experiment:q} --out {output} > {log} 2>&1"
