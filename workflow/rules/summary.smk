# results/summary.csv: one row per cell of the experiment.


rule summary:
    input:
        models=model_manifests(),
    output:
        SUMMARY,
    params:
        overrides=overrides_from_snakemake(config),
    log:
        "logs/results/summary.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff summarize --out {output} {params.overrides:q} > {log} 2>&1"
