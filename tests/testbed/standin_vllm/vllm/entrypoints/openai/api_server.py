"""Stand-in for ``python -m vllm.entrypoints.openai.api_server ARGS`` (vLLM's parser gets ``ARGS``)."""
import sys

if __name__ == "__main__":
    from _vllm_standin.server import main

    sys.exit(main(sys.argv[1:]))
