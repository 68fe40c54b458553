"""Running the DAG's GPU share on a node reached only through limited transfers, and the records it returns."""
