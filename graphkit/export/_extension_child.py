"""Builds one torch C++ extension in a child process: ``python -m graphkit.export._extension_child SPEC``.

graphkit/export/extension.py runs it through ``build_cache.run_tool``, so torch's build
(ninja and the compilers it starts) dies with graphkit, SIGKILL included; an in-process
``cpp_extension.load`` would leave them running. SPEC is JSON: module, sources, flags,
build_dir. On success the library is in build_dir; on failure torch's error is on stderr.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(name=spec["module"], sources=spec["sources"], extra_cflags=spec["flags"],
                           build_directory=spec["build_dir"], verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
