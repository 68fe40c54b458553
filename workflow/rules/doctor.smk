# The hardware doctor: the first rule of every experiment. Every measurement (serve_load) and the
# summary read its record, so it runs before any server starts (and before a CUDA build); it stops the run on
# missing GPUs, a driver older than the build's CUDA toolkit, or uncorrectable ECC errors since boot
# (override: doctor.allow_uncorrected_ecc=true). Historical (aggregate) ECC errors are a warning plus
# gpu_check; ecc_recheck after the last server fails the run if any uncorrectable count grew (bakeoff.hardware.ecc).


checkpoint doctor:
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


# The seed's single-card benchmark: each GPU alone, a short llama-bench, judged against its twin; it does
# nothing unless the doctor found historical uncorrectable ECC errors. Serving jobs wait for it. doctor is a
# checkpoint, so only a record with that history makes the check ask for a GGUF and the tools (gpu_check_inputs).
rule gpu_check:
    input:
        unpack(gpu_check_inputs),
        hardware=HARDWARE,
    output:
        GPU_CHECK,
    params:
        spec=lambda w, input: spec_file(json.dumps({"record": input.hardware, "doctor": CFG.doctor.model_dump(mode="json")})),
        tools=gpu_check_args,
    threads: gpu_check_threads
    priority: 10
    resources:
        **GPU_RESOURCES,
    log:
        "logs/results/gpu-check.log",
    conda:
        LLAMACPP_ENV
    shell:
        "bakeoff stage gpu-check --spec {params.spec:q} {params.tools} --out {output} > {log} 2>&1"


# After the last server (every variant's cells and the kernel benchmarks): ECC counts again. GPUs are matched
# by UUID, so on a cluster that puts this job on another node they show as vanished and the check fails.
rule ecc_recheck:
    input:
        hardware=HARDWARE,
        cells=cell_indexes(),
        kernel=kernel_files(),
    output:
        HARDWARE_AFTER,
    resources:
        **GPU_RESOURCES,
    log:
        "logs/results/hardware-after.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage ecc-recheck --input {input.hardware} --out {output} > {log} 2>&1"
