"""zl_bench harness: the run-spec resolver (cli), the pytest child and its plugins."""
