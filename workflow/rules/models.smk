# Model preparation: fetch, then one rule per format-making method.
# Every rule reads its input's manifest (verifying sha256s) before using it.


rule fetch_model:
    output:
        MODEL_SOURCE,
    params:
        spec=model_spec,
    log:
        "logs/models/{model}/source.log",
    benchmark:
        "logs/bench/models/{model}/source.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage fetch-model --spec {params.spec:q} --out {output} > {log} 2>&1"


rule model_fp16:
    input:
        model_input,
    output:
        MODEL,
    wildcard_constraints:
        format=_alt(formats_with("fp16")),
    log:
        "logs/models/{model}/{format}.log",
    benchmark:
        "logs/bench/models/{model}/{format}.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage model-fp16 --format {wildcards.format} --input {input} --out {output} > {log} 2>&1"


rule quantize_fp8:
    input:
        model_input,
    output:
        MODEL,
    wildcard_constraints:
        format=_alt(formats_with("fp8")),
    params:
        spec=format_spec,
    log:
        "logs/models/{model}/{format}.log",
    benchmark:
        "logs/bench/models/{model}/{format}.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage quantize-fp8 --spec {params.spec:q} --format {wildcards.format} --input {input} --out {output} > {log} 2>&1"


rule dequant_fp8:
    input:
        model_input,
    output:
        MODEL,
    wildcard_constraints:
        format=_alt(formats_with("fp8_dequant")),
    log:
        "logs/models/{model}/{format}.log",
    benchmark:
        "logs/bench/models/{model}/{format}.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage dequant-fp8 --format {wildcards.format} --input {input} --out {output} > {log} 2>&1"


rule convert_gguf:
    input:
        model=model_input,
        tree=lambda w: source_tree_manifest(),
    output:
        MODEL,
    wildcard_constraints:
        format=_alt(formats_with("gguf_convert")),
    params:
        spec=format_spec,
    log:
        "logs/models/{model}/{format}.log",
    benchmark:
        "logs/bench/models/{model}/{format}.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage convert-gguf --spec {params.spec:q} --format {wildcards.format} --input {input.model} --tree {input.tree}"
        " --out {output} > {log} 2>&1"


rule quantize_gguf:
    input:
        model=model_input,
        toolchain=lambda w: toolchain_manifest(),
    output:
        MODEL,
    wildcard_constraints:
        format=_alt(formats_with("gguf_quantize")),
    params:
        spec=format_spec,
    threads: workflow.cores  # Q4_K_M of a 7B model: over 5 minutes on 2 threads
    log:
        "logs/models/{model}/{format}.log",
    benchmark:
        "logs/bench/models/{model}/{format}.tsv"
    conda:
        LLAMACPP_ENV
    shell:
        "bakeoff stage quantize-gguf --spec {params.spec:q} --format {wildcards.format}"
        " --input {input.model} --toolchain {input.toolchain} --out {output} --jobs {threads} > {log} 2>&1"


rule fp8_online:
    input:
        model_input,
    output:
        MODEL,
    wildcard_constraints:
        format=_alt(formats_with("fp8_online")),
    log:
        "logs/models/{model}/{format}.log",
    benchmark:
        "logs/bench/models/{model}/{format}.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff stage fp8-online --format {wildcards.format} --input {input} --out {output} > {log} 2>&1"
