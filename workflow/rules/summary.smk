# results/summary.csv: one row per cell of the experiment (every sweep point), unsupported ones included,
# plus sweep axes, roofline and measured/published ratios (bakeoff.results.derived); results/capacity.csv:
# the capacity searches' results (load.mode: capacity; a header alone otherwise).


rule summary:
    input:
        cells=cell_indexes(),
        quality=variant_files(QUALITY),
        # Not read by the summary: listed so `snakemake results/summary.csv` also writes the samples.
        samples=sample_files(),
        points=POINTS_FILE,
        hardware=HARDWARE,
        published="data/published_numbers.yaml",
        kernel=kernel_files(),
    output:
        summary=SUMMARY,
        capacity=CAPACITY_TABLE,
    params:
        config_hash=CONFIG_HASH,
        # --config served_config_hash=<hash>: a node record served under an earlier config (docs/node-route-vllm.md)
        served=f"--served-config-hash {config[SERVED_KEY]}" if config.get(SERVED_KEY) else "",
    log:
        "logs/results/summary.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff summary {input.cells} --config-hash {params.config_hash} {params.served} --points {input.points}"
        " --published {input.published} --hardware {input.hardware} --kernel {input.kernel} --out {output.summary}"
        " --capacity-out {output.capacity} > {log} 2>&1"


# The run fails (after writing the summary) when an engine's 16-bit baseline measured nothing.
rule check_baselines:
    input:
        SUMMARY,
    output:
        BASELINES,
    log:
        "logs/results/baselines.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff check-baselines {input} --out {output} 2>&1 | tee {log}"
