"""The chaos pipeline's process: `python -m millstream.chaos.worker CONFIG.json`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from millstream import Settings, run
from millstream.chaos.pipeline import build


def main(argv: list[str]) -> int:
    run(build(json.loads(Path(argv[1]).read_text())), Settings.from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
