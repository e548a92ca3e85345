"""``python -m sglang.launch_server``: start the stand-in SGLang server (orch test bed).

See ``sglang._standin.server`` for what it simulates and its ``ORCH_STANDIN_*`` knobs.
"""

import sys

from sglang._standin.server import main

if __name__ == "__main__":
    sys.exit(main())
