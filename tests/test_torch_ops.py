"""The torch side of graphkit ops: C++ forward, extension cache, autograd.Function,
torch.library ops, translation and symbolic hooks derived from OpDefs."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import graphkit_ops  # noqa: E402
from graphkit.errors import ExportError, NativeBuildError  # noqa: E402
from graphkit.export import extension, torch_ops  # noqa: E402
from graphkit.export.torch_ops import (  # noqa: E402
    TorchOps,
    autograd_function,
    library_schema,
    onnxscript_translation,
    scoped_symbolics,
)
from graphkit.ops import Attr, AttrType, OpDef, OpRegistry, Param  # noqa: E402

MY_ADD = graphkit_ops.MY_ADD


def _attr_ref(x, k, alpha, mode, axes, scales):
    return x * alpha + k


# A test op with every attribute type, defined here only (never in custom_ops).
ATTR_OP = OpDef(
    name="gk_test_attrs", doc="x * alpha + k", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
    type_constraints={"T": ("tensor(float)", "tensor(double)")}, reference=_attr_ref,
    infer_shapes=lambda shapes, attrs: [shapes[0]],
    attributes=(Attr("k", AttrType.INT, 3), Attr("alpha", AttrType.FLOAT, 0.5),
                Attr("mode", AttrType.STRING, 'li"n'), Attr("axes", AttrType.INTS, [0, 1]),
                Attr("scales", AttrType.FLOATS, [1.0, 2.5])),
)


@pytest.fixture(scope="module")
def ext():
    """The my_add extension (built once per machine; later runs load the cache)."""
    return extension.load_extension("my_add", "graphkit_ops.my_add", ["my_add_torch.cpp"])


@pytest.fixture
def ops():
    with TorchOps(OpRegistry([MY_ADD, ATTR_OP])) as o:
        yield o


# --------------------------------------------------------------------------- C++ forward

DTYPES = [torch.float32, torch.float64, torch.float16]
SHAPES = [((2, 3), (2, 3)), ((4, 1, 3), (5, 1)), ((3,), ()), ((1, 3), (2, 1))]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_cpp_forward_matches_reference(ext, dtype, shapes):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(shapes[0], generator=gen).to(dtype)
    b = torch.randn(shapes[1], generator=gen).to(dtype)
    got = ext.my_add(a, b)
    want = MY_ADD.reference(a, b)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("a, b, message", [
    (torch.ones(2), torch.ones(2, dtype=torch.float64), "same dtype"),
    (torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32), "float16, float32 or float64"),
    (torch.ones(2, 3), torch.ones(4), "do not broadcast"),
])
def test_cpp_forward_checks_inputs(ext, a, b, message):
    with pytest.raises(RuntimeError, match=r"\[my_add\]") as info:
        ext.my_add(a, b)
    assert str(info.value).startswith("[my_add]") and message in str(info.value)


def test_extension_is_cached_on_disk_and_in_process(ext):
    assert extension.load_extension("my_add", "graphkit_ops.my_add", ["my_add_torch.cpp"]) is ext
    build_dir = extension.extension_build_dir("my_add", "graphkit_ops.my_add", ["my_add_torch.cpp"])
    info = json.loads((build_dir / "graphkit-build.json").read_text())
    assert (build_dir / info["library"]).is_file() and "-O3" in info["flags"]
    # a fresh load of the finished build imports the library without building
    again = extension._import_marked(build_dir, info["module"])
    assert again is not None and again.my_add(torch.ones(1), torch.ones(1)).item() == 3.0


def _package(tmp_path, monkeypatch, name, files):
    pkg = tmp_path / "pkgs" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for fname, text in files.items():
        (pkg / fname).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(tmp_path / "cache"))
    return name


def test_compile_failure_is_native_build_error(tmp_path, monkeypatch):
    pkg = _package(tmp_path, monkeypatch, "gk_broken_ext",
                   {"broken.cpp": "graphkit_test_boom x;  // not C++\n"})
    with pytest.raises(NativeBuildError) as info:
        extension.load_extension("broken", pkg, ["broken.cpp"])
    err = info.value
    assert "graphkit_test_boom" in err.message and "broken" in err.message
    assert "build.log" in err.hint and err.exit_code == 10
    log = next((tmp_path / "cache" / "torch_ext").glob("broken-*/build.log"))
    assert "graphkit_test_boom" in log.read_text()
    assert not list((tmp_path / "cache" / "torch_ext").glob("broken-*/graphkit-build.json"))


def test_missing_source_is_native_build_error(tmp_path, monkeypatch):
    pkg = _package(tmp_path, monkeypatch, "gk_empty_ext", {})
    with pytest.raises(NativeBuildError, match="nope.cpp not found"):
        extension.load_extension("nope", pkg, ["nope.cpp"])


def test_build_lock_excludes_other_processes(tmp_path):
    lock = tmp_path / "x.lock"
    probe = textwrap.dedent(f"""
        import fcntl, sys
        fh = open({str(lock)!r}, "a+b")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            sys.exit(3)
    """)
    with extension._file_lock(lock):
        assert subprocess.run([sys.executable, "-c", probe]).returncode == 3
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0


def test_concurrent_loads_build_once(tmp_path, monkeypatch):
    """Threads racing for one extension: one builds, the others load its result."""
    import threading
    import time
    import types

    pkg = _package(tmp_path, monkeypatch, "gk_race_ext", {"r.cpp": "// never compiled\n"})
    builds = []

    def fake_build(name, package, contents, build_dir, module_name):
        builds.append(name)
        time.sleep(0.2)
        # a real shared library (any will do: it is never imported here), so the cache's
        # checks before a load (size, sha256, ELF structure) pass
        import _ctypes

        (build_dir / "lib.so").write_bytes(Path(_ctypes.__file__).read_bytes())
        (build_dir / "graphkit-build.json").write_text(
            json.dumps({"module": module_name, "library": "lib.so"}))
        return types.SimpleNamespace(built=True)

    monkeypatch.setattr(extension, "_build", fake_build)
    monkeypatch.setattr(extension, "_import_library", lambda name, lib: types.SimpleNamespace(built=False))
    results = []
    threads = [threading.Thread(target=lambda: results.append(extension._load("r", pkg, ("r.cpp",))))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == ["r"] and sorted(r.built for r in results) == [False, False, False, True]


# --------------------------------------------------------------------------- autograd.Function


def test_autograd_function_forward_backward_and_identity():
    F = autograd_function(MY_ADD)
    assert autograd_function(MY_ADD) is F and TorchOps().function("my_add") is F
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, generator=gen, requires_grad=True)
    b = torch.randn(3, generator=gen, requires_grad=True)
    y = F.apply(a, b)
    torch.testing.assert_close(y, MY_ADD.reference(a, b))
    y.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((2, 3), 2.0))
    torch.testing.assert_close(b.grad, torch.full((3,), 2.0))


def test_autograd_function_with_attributes_uses_reference():
    F = autograd_function(ATTR_OP)
    x = torch.ones(2)
    torch.testing.assert_close(F.apply(x, 1, 3.0, "m", [0], [1.0]), torch.full((2,), 4.0))
    torch.testing.assert_close(F.apply(x), torch.full((2,), 3.5))  # attribute defaults
    torch.testing.assert_close(F.apply(x, 1, 2), torch.full((2,), 3.0))  # int for a FLOAT


# --------------------------------------------------------------------------- torch.library op


def test_library_schema_from_opdef():
    assert library_schema(MY_ADD) == "my_add(Tensor a, Tensor b) -> Tensor"
    assert library_schema(ATTR_OP) == ('gk_test_attrs(Tensor x, int k=3, float alpha=0.5, '
                                       'str mode="li\\"n", int[] axes=[0, 1], float[] scales=[1.0, 2.5]) '
                                       '-> Tensor')
    opt = dataclasses.replace(ATTR_OP, name="gk_opt", inputs=(Param("x", "T"), Param("w", "T", optional=True)),
                              attributes=(Attr("k", AttrType.INT),), outputs=(Param("y", "T"), Param("z", "T")))
    # a required attribute after an optional input: the input keeps no default
    assert library_schema(opt) == "gk_opt(Tensor x, Tensor? w, int k) -> (Tensor, Tensor)"


def test_torch_ops_lazy_definition_and_call(ops, ext):
    assert "graphkit::gk_test_attrs" not in torch_ops.defined_ops()
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen)
    torch.testing.assert_close(ops.my_add(a, b), ext.my_add(a, b))
    x = torch.ones(2)
    torch.testing.assert_close(ops.gk_test_attrs(x), torch.full((2,), 3.5))  # defaults
    torch.testing.assert_close(ops.gk_test_attrs(x, 1, 2.0, "q", [1], [0.0]), torch.full((2,), 3.0))
    assert torch_ops.defined_ops()["graphkit::gk_test_attrs"] is ATTR_OP
    with pytest.raises(AttributeError, match="no op named .nope."):
        ops.nope


def test_library_op_gradients(ops):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: ops.my_add(x, y), (a, b))


def test_fake_kernel_runs_reference_and_checks_dtypes(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = ops.my_add
    with FakeTensorMode():
        y = op(torch.empty(4, 1, 3), torch.empty(5, 1))
        assert y.shape == (4, 5, 3)
        with pytest.raises(TypeError, match=r"\[my_add\] input 'b' must be one of"):
            op(torch.empty(2), torch.empty(2, dtype=torch.int32))


def test_one_definition_per_op_name(ops):
    ops.gk_test_attrs  # noqa: B018 - defines it
    with TorchOps(OpRegistry([ATTR_OP])) as same:  # the same OpDef shares the definition
        torch.testing.assert_close(same.gk_test_attrs(torch.ones(1)), torch.full((1,), 3.5))
    other = dataclasses.replace(ATTR_OP, doc="a different definition")
    with TorchOps(OpRegistry([other])) as clash, pytest.raises(ExportError, match="already defined"):
        clash.gk_test_attrs  # noqa: B018
    # the first owner still works after the others closed
    torch.testing.assert_close(ops.gk_test_attrs(torch.ones(1)), torch.full((1,), 3.5))


def test_close_destroys_the_library():
    op = dataclasses.replace(ATTR_OP, name="gk_test_close")
    first = TorchOps(OpRegistry([op]))
    first.gk_test_close  # noqa: B018
    assert hasattr(torch.ops.graphkit, "gk_test_close")
    first.close()
    assert "graphkit::gk_test_close" not in torch_ops.defined_ops()
    assert not hasattr(torch.ops.graphkit, "gk_test_close")
    with pytest.raises(ExportError, match="closed"):
        first.gk_test_close  # noqa: B018
    # a different definition of the name is allowed once the first is gone
    with TorchOps(OpRegistry([dataclasses.replace(op, doc="second")])) as second:
        torch.testing.assert_close(second.gk_test_close(torch.ones(1)), torch.full((1,), 3.5))


# --------------------------------------------------------------------------- exporter hooks


def test_translation_signature_seen_by_torch_exporter():
    """torch's exporter infers inputs vs attributes from the function's annotations."""
    from onnx_ir import AttributeType
    from onnx_ir.schemas import AttributeParameter, Parameter
    from torch.onnx._internal.exporter import _schemas

    fn = onnxscript_translation(ATTR_OP)
    assert list(inspect.signature(fn).parameters) == ["x", "k", "alpha", "mode", "axes", "scales"]
    sig = _schemas.op_signature_from_function(fn, "custom", fn.__name__)
    kinds = {p.name: p for p in sig.params}
    assert isinstance(kinds["x"], Parameter) and kinds["x"].required
    expected = {"k": AttributeType.INT, "alpha": AttributeType.FLOAT, "mode": AttributeType.STRING,
                "axes": AttributeType.INTS, "scales": AttributeType.FLOATS}
    for name, attr_type in expected.items():
        assert isinstance(kinds[name], AttributeParameter) and kinds[name].type == attr_type
        assert not kinds[name].required
    assert len(sig.outputs) == 1


def test_custom_translation_table_keys(ops):
    ops.my_add  # noqa: B018
    table = torch_ops.custom_translation_table([MY_ADD])
    assert list(table) == [torch.ops.graphkit.my_add.default]


def test_scoped_symbolics_unregister_on_exit_and_error(ops):
    ops.my_add  # noqa: B018
    assert not torch_ops.symbolic_registered("my_add")
    with scoped_symbolics([MY_ADD]) as names:
        assert names == ["graphkit::my_add"] and torch_ops.symbolic_registered("my_add")
    assert not torch_ops.symbolic_registered("my_add")
    with pytest.raises(ValueError, match="boom"), scoped_symbolics([MY_ADD]):
        assert torch_ops.symbolic_registered("my_add")
        raise ValueError("boom")
    assert not torch_ops.symbolic_registered("my_add")


@pytest.mark.parametrize("opset", [7, 8, 9, 20])
def test_scoped_symbolics_serve_every_torchscript_opset(ops, opset):
    """torch serves opsets 7-8 only from a registration in [target, 9] (its legacy rule):
    symbolics registered at opset 1 left graphkit's library ops unexportable there."""
    ops.my_add  # noqa: B018
    with scoped_symbolics([MY_ADD]):
        assert torch_ops.symbolic_registered("my_add", opset)


def test_import_graphkit_does_not_import_torch():
    code = "import graphkit, sys; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
