"""graphkit's rewrite with the objects writer only (rewrite_model's passes; the byte writer off):
what `graphkit rewrite` would cost without the wire-level writer."""
import sys

from graphkit.publish import atomic_write
from graphkit.rewrite.files import rewrite_bytes

with open(sys.argv[1], "rb") as f:
    data = f.read()
out, report = rewrite_bytes(data, path=sys.argv[1], fast=False)
with atomic_write(sys.argv[2]) as tmp:
    tmp.write_bytes(out)
