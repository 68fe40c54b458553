# Kernel-only speed of each GGUF (llama-bench pp512/tg128) at the server's flash-attention setting, on the
# node that serves: the summary puts it beside the served rows (kernel_tg_tok_s, served_over_kernel).
# threads = all cores and the hardware's GPUs, like serve_load, so it never shares the GPU with a server.


rule kernel_bench:
    input:
        hardware=HARDWARE,
        model=MODEL,
        toolchain=lambda w: toolchain_manifest(),
    output:
        KERNEL,
    params:
        hardware=hardware_spec,
    threads: workflow.cores
    resources:
        **GPU_RESOURCES,
    log:
        "logs/results/kernel/{model}/{format}-fa{fa}.log",
    benchmark:
        "logs/bench/results/kernel/{model}/{format}-fa{fa}.tsv"
    conda:
        LLAMACPP_ENV
    shell:
        "bakeoff stage kernel-bench --hardware {params.hardware:q} --flash-attn {wildcards.fa} --input {input.model}"
        " --toolchain {input.toolchain} --out {output} > {log} 2>&1"
