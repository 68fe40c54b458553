# The pinned llama.cpp toolchain: one source tree, built once per backend.


rule fetch_llamacpp:
    output:
        LLAMACPP_SRC,
    params:
        spec=toolchain_spec,
    log:
        "logs/build/llamacpp/src-{commit}.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage fetch-llamacpp --spec {params.spec:q} --out {output} > {log} 2>&1"


rule build_llamacpp:
    input:
        src=lambda w: source_tree_manifest(),
        doctor=BUILD_GATE,  # the doctor first (CUDA: its driver check; everywhere: its bandwidth probe alone)
    output:
        TOOLCHAIN,
    params:
        spec=toolchain_spec,
        hardware=hardware_spec,
    threads: build_threads()
    log:
        "logs/build/llamacpp/{toolchain}.log",
    benchmark:
        "logs/bench/build/llamacpp/{toolchain}.tsv"
    conda:
        LLAMACPP_ENV
    shell:
        "bakeoff stage build-llamacpp --spec {params.spec:q} --hardware {params.hardware:q}"
        " --input {input.src} --out {output} --jobs $(( {threads} + 1 )) > {log} 2>&1"


# The scorer's Python binding, on the toolchain's own libllama (no second compile).
rule build_llamacpp_python:
    input:
        src=lambda w: source_tree_manifest(),
        toolchain=TOOLCHAIN,
    output:
        PYBINDING,
    params:
        spec=toolchain_spec,
        hardware=hardware_spec,
    log:
        "logs/build/llamacpp-python/{toolchain}.log",
    benchmark:
        "logs/bench/build/llamacpp-python/{toolchain}.tsv"
    conda:
        LLAMACPP_ENV
    shell:
        "bakeoff stage build-llamacpp-python --spec {params.spec:q} --hardware {params.hardware:q}"
        " --input {input.src} --toolchain {input.toolchain} --out {output} > {log} 2>&1"
