# results/samples/: every variant's generations of the fixed prompt set, side by side.


rule samples:
    input:
        lambda w: variant_files(VARIANT_SAMPLES, w.experiment),
    output:
        SAMPLES,
    log:
        "logs/results/samples/{experiment}/{model}.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff samples {input} --out {output} > {log} 2>&1"
