# One job per server config: start the engine once, run all its load cells, score its quality
# (on the same server, or on the engine's eval_server for the same artifact), stop it.
# $PPID (of the job shell) is snakemake: if it dies, even by SIGKILL, the stage stops its server.
# threads = all cores, so a measurement never shares the machine with another job. A model that is ready is
# served before the next one is made (priority), so a node cut off by a time limit returns cells, not GGUFs.


# With load.repeats > 1, each earlier block of a variant is its own job and server start (serve_block); the
# last block is serve_load's, which also scores quality. Every job waits for the one before it in the
# experiment's seeded schedule (input "after", bakeoff.loadgen.blocks).
rule serve_block:
    input:
        unpack(serve_inputs),
    output:
        block=BLOCK,
    params:
        spec=serve_spec,
        toolchain=toolchain_arg,
    threads: workflow.cores
    priority: 5
    resources:
        **GPU_RESOURCES,
        runtime=serve_runtime(last_block=False),
    log:
        "logs/results/raw/{experiment}/{model}/{engine}-{format}-block{block}.log",
    benchmark:
        "logs/bench/results/raw/{experiment}/{model}/{engine}-{format}-block{block}.tsv"
    conda:
        serve_env
    shell:
        "bakeoff stage serve-block --spec {params.spec:q} --format {wildcards.format} --input {input.model}"
        " --tokenizer {input.tokenizer} {params.toolchain} --out {output.block} --watch-pid $PPID > {log} 2>&1"


rule serve_load:
    input:
        unpack(serve_inputs),
    output:
        cells=CELLS,
        quality=QUALITY,
        samples=VARIANT_SAMPLES,
    params:
        spec=serve_spec,
        toolchain=toolchain_arg,
    threads: workflow.cores
    priority: 5
    resources:
        **GPU_RESOURCES,
        runtime=serve_runtime(last_block=True),
    log:
        "logs/results/raw/{experiment}/{model}/{engine}-{format}.log",
    benchmark:
        "logs/bench/results/raw/{experiment}/{model}/{engine}-{format}.tsv"
    conda:
        serve_env
    shell:
        "bakeoff stage serve-load --spec {params.spec:q} --format {wildcards.format} --input {input.model}"
        " --tokenizer {input.tokenizer} {params.toolchain} --out {output.cells} --watch-pid $PPID > {log} 2>&1"
