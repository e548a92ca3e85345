"""Stand-in for vLLM's console script ``vllm`` (``vllm.entrypoints.cli.main:main``): ``vllm serve``
runs the stand-in server with ``["serve", ...]``, as vLLM's parser receives it; another subcommand
is refused."""
import sys


def main() -> int:
    if sys.argv[1:2] != ["serve"]:
        print(f"vllm: the stand-in serves only 'vllm serve', not {sys.argv[1:2]}", file=sys.stderr)
        return 2
    from _vllm_standin.server import main as serve

    return serve(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
