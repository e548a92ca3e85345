"""The stand-in vLLM server (tests/testbed/README.md, "Stand-in vLLM")."""
