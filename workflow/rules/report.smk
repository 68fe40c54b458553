# Report side of the DAG: the invocation's config and versions, plots, HTML pages, DVC metrics.
# `snakemake --report report.html` collects everything flagged report() below.

report: "../report/workflow.rst"


rule points:
    input:
        spec=POINTS_SPEC,
    output:
        POINTS_FILE,
    params:
        smk_config=lambda w: json.dumps(config, sort_keys=True),
        hashes=POINT_HASHES,
    log:
        "logs/results/config.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff points --smk-config {params.smk_config:q} --hashes {params.hashes:q} --out {output} > {log} 2>&1"


rule versions:
    # After the summary: re-gathered with every new result (git sha, driver, packages may have changed).
    input:
        unpack(versions_inputs),
    output:
        VERSIONS,
    params:
        toolchain=lambda w, input: f"--toolchain {input.toolchain}" if "toolchain" in input.keys() else "",
    log:
        "logs/results/versions.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff versions --config {input.config} {params.toolchain} --model-source {input.model_source}"
        " --hardware-json {input.hardware} --summary {input.summary} --out {output} > {log} 2>&1"


rule plots:
    input:
        summary=SUMMARY,
        cells=cell_indexes(),
    output:
        report(PLOT.format(name="throughput_vs_concurrency"), category="Throughput",
               caption="../report/throughput.rst"),
        report(PLOT.format(name="ttft"), category="Latency", caption="../report/ttft.rst"),
        report(PLOT.format(name="tpot"), category="Latency", caption="../report/tpot.rst"),
        report(PLOT.format(name="quality_vs_speed"), category="Quality", caption="../report/quality.rst"),
        report(PLOT.format(name="roofline"), category="Roofline", caption="../report/roofline.rst"),
    log:
        "logs/results/plots.log",
    benchmark:
        "logs/bench/results/plots.tsv"
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff plots {input.cells} --summary {input.summary} --out results/plots > {log} 2>&1"


rule pages:
    input:
        summary=SUMMARY,
        capacity=CAPACITY_TABLE,
        plots=plot_files(),
        versions=VERSIONS,
        config=POINTS_FILE,
        hardware=HARDWARE,
    output:
        index=report(REPORT_PAGE.format(page="index"), category="Summary", caption="../report/index.rst"),
        summary=report(REPORT_PAGE.format(page="summary"), category="Summary", caption="../report/summary.rst"),
        environment=report(REPORT_PAGE.format(page="environment"), category="Hardware and versions",
                           caption="../report/environment.rst"),
        answer=ANSWER_TABLE,
    log:
        "logs/results/report/pages.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff pages --summary {input.summary} --versions {input.versions} --config {input.config}"
        " --hardware-json {input.hardware} --summary-html {output.summary}"
        " --environment-html {output.environment} --index-html {output.index} --capacity {input.capacity}"
        " --answer-csv {output.answer}"
        " --plots {input.plots} > {log} 2>&1"


rule dvc_metrics:
    input:
        SUMMARY,
    output:
        DVC_METRICS,
    log:
        "logs/results/metrics.log",
    conda:
        "../../envs/bakeoff.yaml"
    shell:
        "bakeoff dvc-metrics {input} --out {output} > {log} 2>&1"
