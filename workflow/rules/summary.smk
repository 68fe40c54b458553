# results/summary.csv: one row per cell of the experiment, unsupported ones included.


rule summary:
    input:
        cells=cell_indexes(),
        quality=variant_files(QUALITY),
        # Not read by the summary: listed so `snakemake results/summary.csv` also writes the samples.
        samples=SAMPLES.format(experiment=CFG.experiment.name, model=MODEL_NAME),
    output:
        SUMMARY,
    params:
        config_hash=CONFIG_HASH,
    log:
        "logs/results/summary.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff summarize {input.cells} --config-hash {params.config_hash} --out {output} > {log} 2>&1"
