# results/summary.csv: one row per cell of the experiment, unsupported ones included.


rule summary:
    input:
        cell_indexes(),
    output:
        SUMMARY,
    params:
        config_hash=CONFIG_HASH,
    log:
        "logs/results/summary.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff summarize {input} --config-hash {params.config_hash} --out {output} > {log} 2>&1"
