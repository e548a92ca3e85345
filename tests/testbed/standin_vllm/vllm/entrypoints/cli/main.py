"""Stand-in for vLLM's console script ``vllm`` (``vllm.entrypoints.cli.main:main``, also run as
``python -m vllm.entrypoints.cli.main``): ``vllm serve`` runs the stand-in server with
``["serve", ...]``, as vLLM's parser receives it; ``vllm bench serve`` runs the stand-in benchmark
client (``_vllm_standin/bench.py``); another subcommand is refused."""
import sys


def main() -> int:
    if sys.argv[1:3] == ["bench", "serve"]:
        from _vllm_standin.bench import main as bench

        return bench(sys.argv[3:])
    if sys.argv[1:2] != ["serve"]:
        print(f"vllm: the stand-in serves only 'vllm serve' and 'vllm bench serve', not {sys.argv[1:3]}",
              file=sys.stderr)
        return 2
    from _vllm_standin.server import main as serve

    return serve(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
