# The hardware doctor: the first rule of every experiment. Every measurement (serve_load) and the
# summary read its record, so it runs before any server starts; it stops the run on missing GPUs or
# uncorrectable ECC errors (override: doctor.allow_uncorrected_ecc=true).


rule doctor:
    output:
        HARDWARE,
    params:
        spec=doctor_spec,
    priority: 100
    resources:
        **GPU_RESOURCES,
    log:
        "logs/results/hardware.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage doctor --spec {params.spec:q} --out {output} > {log} 2>&1"
