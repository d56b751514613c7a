"""The main job end to end: every sample exported, rewritten, run in ORT, compared with torch.

    python samples/run_all.py [OUT_DIR]      (models are written to OUT_DIR, default ./out)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-5


def _load(sample: Path):
    spec = importlib.util.spec_from_file_location(f"sample_{sample.name}", sample / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(out_root: Path) -> int:
    failures = 0
    print(f"{'sample':<15} {'exporter':<12} {'lowering':<15} {'max abs err':>12}  result")
    for sample in sorted(p for p in HERE.iterdir() if (p / "run.py").is_file()):
        out_dir = out_root / sample.name
        out_dir.mkdir(parents=True, exist_ok=True)
        for exporter, lowering, err in _load(sample).main(out_dir):
            ok = err <= TOLERANCE
            failures += not ok
            print(f"{sample.name:<15} {exporter:<12} {lowering:<15} {err:>12.3g}  {'ok' if ok else 'MISMATCH'}")
    print("all outputs match torch" if not failures else f"{failures} mismatch(es)")
    _draw(out_root)
    return 1 if failures else 0


def _draw(out_root: Path) -> None:
    """Pictures of one rewrite (the detector's deform_conv2d gathered by standard ops), when graphviz is here."""
    from graphkit.errors import ToolError
    from graphkit.modelio import load_model
    from graphkit.pictures import write_diff

    before = out_root / "deform_conv" / "detector.torchscript.onnx"
    after = out_root / "deform_conv" / "detector.torchscript.gather.onnx"
    if not (before.is_file() and after.is_file()):
        return
    try:
        files = write_diff(load_model(before), load_model(after), out_root / "pictures",
                           before_name=before.name, after_name=after.name)
    except ToolError as exc:
        print(f"no pictures: {exc}")
        return
    print(f"what the rewrite changed: open {files[0]}")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("out")))
