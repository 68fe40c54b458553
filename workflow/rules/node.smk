# The GPU node's share of the DAG, as one target: `snakemake --cores all node` on the node (bakeoff.node
# packs this checkout for it and unpacks what comes back); the submit host's `snakemake` does the rest.


rule node:
    input:
        node_outputs(),


# What node.sh --prepare makes in the background while vLLM's parts arrive: the models and the builds.
rule node_prepare:
    input:
        prepare_outputs(),
