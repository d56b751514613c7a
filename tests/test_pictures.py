"""Pictures of what a rewrite changed: `graphkit rewrite --diff DIR` and `graphkit show`."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from html.parser import HTMLParser

import onnx
import pytest
from onnx import TensorProto, helper

from conftest import REPO, error_lines, my_add_model, run_cli

# `make test` installs graphviz and chromium where it can (Makefile: sysdeps); a missing tool
# skips, unless GRAPHKIT_REQUIRE_TOOLS=1.
REQUIRE_TOOLS = os.environ.get("GRAPHKIT_REQUIRE_TOOLS") == "1"


def _need(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        if REQUIRE_TOOLS:
            pytest.fail(f"{program} is not installed (the Makefile's sysdeps target installs it)")
        pytest.skip(f"{program} is not installed")
    return found


@pytest.fixture(autouse=True)
def _dot():
    _need("dot")


class _Page(HTMLParser):
    """Collects what a self-contained page must (not) have."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value and (value.startswith(("http:", "https:", "//"))):
                self.external.append(value)
            if tag == "a" and name == "href":
                self.links.append(value)

    def handle_data(self, data):
        self.text.append(data)


def _page(path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def _svg_texts(path) -> list[str]:
    root = ET.parse(path).getroot()  # raises on invalid XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.text]


def test_rewrite_diff_draws_the_decomposed_region(tmp_path):
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), tmp_path / "model.onnx")
    proc = run_cli("rewrite", "model.onnx", "std.onnx", "--diff", "pics", cwd=tmp_path, check_rc=0)
    assert "pics/index.html" in proc.stdout
    pics = tmp_path / "pics"
    assert sorted(p.name for p in pics.iterdir()) == [
        "index.html", "region-001-after.svg", "region-001-before.svg", "region-001.html"]
    before = _svg_texts(pics / "region-001-before.svg")
    after = _svg_texts(pics / "region-001-after.svg")
    assert "custom::my_add" in before and "add0" in before
    assert {"Mul", "Add", "Constant"} <= set(after) and "custom::my_add" not in after
    assert any("float32[2,3]" in t for t in after)  # shapes from shape inference
    assert "value=2.0" in after  # the Constant's value, not an opaque tensor
    page = _page(pics / "region-001.html")
    assert page.tags.count("svg") == 2 and not page.external
    assert "decompose:mul_add" in "".join(page.text)
    index = _page(pics / "index.html")
    assert index.links == ["region-001.html"] and not index.external
    assert "custom::my_add -> Constant, Mul, Add" in "".join(index.text)
    # the rewrite itself is the same as without --diff
    run_cli("rewrite", "model.onnx", "plain.onnx", cwd=tmp_path, check_rc=0)
    assert onnx.load(tmp_path / "std.onnx") == onnx.load(tmp_path / "plain.onnx")


def _chain(n: int) -> onnx.ModelProto:
    """n unnamed custom::my_add nodes, each followed by a Relu."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("my_add", [prev, "x"], [f"s{i}"], domain="custom"))
        nodes.append(helper.make_node("Relu", [f"s{i}"], [f"r{i}"]))
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])


def test_identical_regions_are_drawn_once_with_their_count(tmp_path):
    onnx.save(_chain(30), tmp_path / "chain.onnx")
    run_cli("rewrite", "chain.onnx", "out.onnx", "--diff", "pics", cwd=tmp_path, check_rc=0)
    pics = tmp_path / "pics"
    assert sorted(p.name for p in pics.glob("region-*.html")) == ["region-001.html"]
    text = "".join(_page(pics / "region-001.html").text)
    assert "30 regions like this" in text and "#0 custom::my_add, #2 custom::my_add" in text and "(18 more)" in text


def test_rule_regions_name_the_rule(tmp_path):
    from graphkit.pictures import diff_regions

    std, _ = _rewrite(my_add_model(shape_a=(2, 3), shape_b=(2, 3)))
    run_cli_rules = tmp_path / "std.onnx"
    onnx.save(std, run_cli_rules)
    shutil.copy(REPO / "samples" / "rules" / "fuse_my_add.py", tmp_path / "rules.py")
    run_cli("rewrite", "std.onnx", "fused.onnx", "--rules", "rules.py", "--keep-custom", "--diff", "pics",
            cwd=tmp_path, check_rc=0)
    text = "".join(_page(tmp_path / "pics" / "region-001.html").text)
    assert "rules: fuse_my_add" in text
    fused = onnx.load(tmp_path / "fused.onnx")
    (region,) = diff_regions(std.graph, fused.graph, rules=["fuse_my_add"])
    assert sorted(n.op_type for n in region.before) == ["Add", "Constant", "Mul"]
    assert [n.op_type for n in region.after] == ["my_add"]


def _rewrite(model):
    from graphkit.rewrite import rewrite_model

    return rewrite_model(model)


def test_separate_regions_stay_separate():
    """Two placeholders lowered differently are two regions, even when they read one input."""
    from graphkit.pictures import diff_regions

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("my_add", ["x", "x"], ["a"], domain="custom", name="first"),
             helper.make_node("Relu", ["x"], ["b"], name="keep"),
             helper.make_node("Asinh", ["x"], ["c"], name="second")]
    before = helper.make_graph(nodes, "g", [x], [])
    after = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"], name="first/Add"),
                               helper.make_node("Add", ["t", "x"], ["a"], name="first/Add2"),
                               nodes[1],
                               helper.make_node("Sinh", ["x"], ["c"], name="second/Sinh")], "g", [x], [])
    regions = diff_regions(before, after)
    assert sorted(r.title for r in regions) == ["Asinh -> Sinh", "custom::my_add -> Add x2"]
    assert all(r.count == 1 for r in regions)


def test_show_draws_a_whole_model_and_refuses_a_huge_one(tmp_path):
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), tmp_path / "model.onnx")
    run_cli("show", "model.onnx", "-o", "whole", cwd=tmp_path, check_rc=0)
    texts = _svg_texts(tmp_path / "whole" / "graph.svg")
    assert "custom::my_add" in texts and "Relu" in texts
    assert _page(tmp_path / "whole" / "graph.html").tags.count("svg") == 1
    onnx.save(_chain(300), tmp_path / "big.onnx")
    proc = run_cli("show", "big.onnx", "-o", "big", cwd=tmp_path, check_rc=2)
    (line,) = error_lines(proc.stderr)
    assert "600 nodes" in line and "graphkit show BEFORE.onnx AFTER.onnx" in line
    assert not (tmp_path / "big").exists()


def test_show_diff_of_two_files_and_a_rerun_removes_stale_pages(tmp_path):
    onnx.save(_chain(2), tmp_path / "a.onnx")
    # a model whose two placeholders are lowered differently: two kinds of region
    model = _chain(2)
    model.graph.node[2].op_type = "Asinh"
    model.graph.node[2].domain = ""
    del model.graph.node[2].input[1]
    onnx.save(model, tmp_path / "b.onnx")
    run_cli("rewrite", "b.onnx", "b.std.onnx", cwd=tmp_path, check_rc=0)
    run_cli("show", "b.onnx", "b.std.onnx", "-o", "pics", cwd=tmp_path, check_rc=0)
    assert len(list((tmp_path / "pics").glob("region-*.html"))) == 1
    (tmp_path / "pics" / "region-007.html").write_text("stale")
    run_cli("rewrite", "a.onnx", "a.std.onnx", cwd=tmp_path, check_rc=0)
    run_cli("show", "a.onnx", "a.std.onnx", "-o", "pics", cwd=tmp_path, check_rc=0)
    assert sorted(p.name for p in (tmp_path / "pics").glob("region-*.html")) == ["region-001.html"]


def test_missing_dot_is_one_line_exit_15_and_nothing_written(tmp_path):
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), tmp_path / "model.onnx")
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare)}
    proc = run_cli("rewrite", "model.onnx", "out.onnx", "--diff", "pics", cwd=tmp_path, env=env, check_rc=15)
    (line,) = error_lines(proc.stderr)
    assert "dot" in line and "apt-get install graphviz" in line
    assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "pics").exists()
    proc = run_cli("show", "model.onnx", "-o", "pics", cwd=tmp_path, env=env, check_rc=15)
    assert not (tmp_path / "pics").exists()


def test_pictures_folder_errors(tmp_path):
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), tmp_path / "model.onnx")
    (tmp_path / "file").write_text("x")
    proc = run_cli("rewrite", "model.onnx", "out.onnx", "--diff", "file", cwd=tmp_path, check_rc=4)
    assert "pictures folder is a file" in error_lines(proc.stderr)[0]
    assert not (tmp_path / "out.onnx").exists()
    proc = run_cli("show", "model.onnx", "-o", "no/such/dir", cwd=tmp_path, check_rc=4)
    assert "create no/such first" in error_lines(proc.stderr)[0]


def _png_pixels(path) -> tuple[int, int, bytes]:
    """Width, height and the raw (filtered) scanlines of an 8-bit PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_a_headless_browser_renders_the_page(tmp_path):
    """Debian's chromium, headless and offline, renders the region page: the screenshot has
    the page's size and is not blank."""
    browser = _need("chromium")
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), tmp_path / "model.onnx")
    run_cli("rewrite", "model.onnx", "std.onnx", "--diff", "pics", cwd=tmp_path, check_rc=0)
    shot = tmp_path / "shot.png"
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--user-data-dir=" + str(tmp_path / "profile"), "--window-size=900,700",
                           f"--screenshot={shot}", (tmp_path / "pics" / "region-001.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    width, height, raw = _png_pixels(shot)
    assert (width, height) == (900, 700)
    # A blank page compresses to a handful of distinct bytes; drawn boxes, text and arrows do not.
    assert len(set(raw)) > 64
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--user-data-dir=" + str(tmp_path / "profile2"), "--dump-dom",
                          (tmp_path / "pics" / "region-001.html").as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and dom.stdout.count("<svg") == 2 and "custom::my_add" in dom.stdout


def test_samples_draw_their_rewrite(tmp_path):
    """`make demo` ends with a picture of one rewrite (samples/run_all.py's _draw)."""
    sys.path.insert(0, str(REPO / "samples"))
    try:
        import run_all
    finally:
        sys.path.remove(str(REPO / "samples"))
    from graphkit.rewrite import Lowering, rewrite_model

    d = tmp_path / "deform_conv"
    d.mkdir()
    onnx.save(my_add_model(shape_a=(2, 3), shape_b=(2, 3)), d / "detector.torchscript.onnx")
    out, _ = rewrite_model(onnx.load(d / "detector.torchscript.onnx"), lowering=Lowering.DECOMPOSE)
    onnx.save(out, d / "detector.torchscript.gather.onnx")
    run_all._draw(tmp_path)
    assert (tmp_path / "pictures" / "index.html").is_file()


def test_hostile_names_and_unknown_types_are_drawn_escaped(tmp_path):
    """Op types and names from the model are text, never markup; unknown element types read '?'."""
    from graphkit.pictures import write_graph

    node = helper.make_node("<script>x</script>", ["a"], ["b"], domain="evil", name="<img src=x>")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 0, [2])],
                              [helper.make_tensor_value_info("b", 99, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("evil", 1)])
    page, svg = write_graph(model, tmp_path / "pics", name="<i>model</i>.onnx")
    text = page.read_text()
    assert "<script>" not in text and "<img" not in text and "<i>model" not in text
    assert "&lt;script&gt;" in text
    assert "?[2]" in "".join(_svg_texts(svg))
