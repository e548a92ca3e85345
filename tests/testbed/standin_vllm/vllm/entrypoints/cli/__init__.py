"""Stand-in ``vllm`` package of the test bed (see tests/testbed/README.md, "Stand-in vLLM"): only the
entry points live here; the server (``_vllm_standin.server``) runs the real release's modules."""
