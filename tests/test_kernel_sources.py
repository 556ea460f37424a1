"""Every CUDA source in pystrom/kernels compiles as host C++, and defines every kernel the package asks for.

CI has no GPU, so a syntax error in a ``.cu`` file, a template that no longer instantiates, or a kernel
removed or renamed while Python still asks for it would first show on the GPU machine, at a user's
first call. Here each source is compiled by the host compiler after tests/simt.py's emulation of CUDA's
keywords and intrinsics, and the names are looked up in the result: every name passed as a literal to
``kernels.kernel`` / ``kernels.launch`` anywhere in the package, and every name the logistic passes build
(ml/_narrow.py, ml/_wide.py from their shape tables). NVRTC, not g++, compiles them for real: this
catches what both would refuse, not everything NVRTC would. What the kernels compute is checked by the
``*_emulated.py`` tests and on the GPU machine.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import ctypes
from importlib import resources
from pathlib import Path

import pytest
import simt

import pystrom
from pystrom.ml import _wide
from pystrom.ml._pass import MAX_KERNEL_FEATURES

pytestmark = pytest.mark.skipif(simt.CXX is None, reason="no C++ compiler (the project's extension needs one anyway)")

SOURCES = sorted(p.stem for p in Path(str(resources.files("pystrom.kernels"))).glob("*.cu"))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, ctypes.CDLL]:
    work = tmp_path_factory.mktemp("kernels")
    failed = {}

    def build(name: str) -> tuple[str, ctypes.CDLL | None]:
        try:
            return name, simt.build(name, "", work)
        except AssertionError as exc:  # simt.build's message carries the compiler's
            failed[name] = str(exc)[-2000:]
            return name, None

    with cf.ThreadPoolExecutor(4) as pool:
        built = dict(pool.map(build, SOURCES))
    assert not failed, f"kernel sources that do not compile as C++: {failed}"
    return built


def _literal_requests() -> set[tuple[str, str]]:
    """(source, kernel) of every kernel(...) / launch(...) call in the package whose first two arguments
    are string literals."""
    found = set()
    for path in Path(pystrom.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            a, b = node.args[:2]
            if name in ("kernel", "launch") and all(
                isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (a, b)
            ):
                found.add((a.value, b.value))
    return found


def _logistic_requests() -> set[tuple[str, str]]:
    """The names ml/_narrow.py and ml/_wide.py build, over every shape their tables allow."""
    out = set()
    for t in ("f32", "f64"):
        for k in range(1, MAX_KERNEL_FEATURES + 1):
            out |= {
                ("logistic", f"logit_pass_{t}_k{k}"),
                ("logistic", f"logit_spec_{t}_k{k}"),
                ("logistic", f"logit_step_k{k}"),
                ("logistic", f"logit_parts_{t}_k{k}"),
                ("logistic", f"logit_parts_spec_{t}_k{k}"),
                ("logistic", f"logit_gather_step_k{k}"),
            }
        for z in ("32", "64"):
            for threads, f in _wide._FUSED:
                out.add(("logistic_wide", f"logit_wide_fused_{t}_z{z}_f{f}_r{_wide._ROWS_PER_WARP}_t{threads}"))
            for threads, q in _wide._VECTOR:
                out.add(("logistic_wide", f"logit_wide_vec_{t}_z{z}_q{q}_t{threads}"))
    return out


def test_every_source_compiles(compiled):
    assert set(compiled) == set(SOURCES) and len(SOURCES) >= 10


def test_every_kernel_asked_for_is_defined(compiled):
    literal = _literal_requests()
    assert len(literal) >= 15, literal  # the scan finds the package's calls (17 when written)
    assert {s for s, _ in literal} <= set(SOURCES), literal
    missing = sorted((s, k) for s, k in literal | _logistic_requests() if not hasattr(compiled[s], k))
    assert not missing, f"kernels asked for but not defined: {missing}"


def test_the_check_sees_a_missing_kernel(compiled):
    assert hasattr(compiled["logistic_wide"], "logit_wide_finish")
    assert not hasattr(compiled["logistic_wide"], "logit_wide_fused_f32_z32_f1_r2_t256")  # R = 2: not compiled


@pytest.mark.parametrize("tname", ["f32", "f64"])
def test_a_fit_builds_only_the_logistic_kernels_it_uses(tmp_path, monkeypatch, tname):
    """ml/_narrow.py logit_kernel builds logistic.cu for one width, one input type and one use (a fit's
    pass, speculative pass and step; a dask worker's parts kinds and the step after its all-gather): each
    build holds every kernel asked of it and no other width's, type's or use's (those would cost the first
    fit their compile time)."""
    import pystrom.kernels
    from pystrom.ml._narrow import logit_kernel

    asked: dict[tuple[str, ...], set[str]] = {}

    def kernel(source: str, fn: str, ordinal: int, defines: tuple[str, ...] = ()) -> None:
        asked.setdefault(defines, set()).add(fn)

    monkeypatch.setattr(pystrom.kernels, "kernel", kernel)
    k = 3
    for fn in (f"logit_pass_{tname}_k{k}", f"logit_spec_{tname}_k{k}", f"logit_step_k{k}", f"logit_parts_{tname}_k{k}",
               f"logit_parts_spec_{tname}_k{k}", f"logit_gather_step_k{k}"):  # fmt: skip
        logit_kernel(fn, k, 0, tname)
    for fn in (f"logit_pass_{tname}_k{k}", f"logit_spec_{tname}_k{k}", f"logit_step_k{k}"):
        logit_kernel(fn, k, 0, tname, unweighted=True)  # an unweighted fit's build
    assert len(asked) == 3 and all(len(fns) == 3 for fns in asked.values())
    assert sum("LOGIT_UNWEIGHTED" in defines for defines in asked) == 1
    every = {name for source, name in _logistic_requests() if source == "logistic"}
    for defines, fns in asked.items():
        lib = simt.build("logistic", "", tmp_path, defines=defines)
        assert {name for name in every if hasattr(lib, name)} == fns, defines


@pytest.mark.parametrize(
    "defines, shape",
    [
        (("WIDE_FUSED_F=2", "WIDE_THREADS=256"), "fused_{t}_z{z}_f2_r1_t256"),
        (("WIDE_VEC_Q=2", "WIDE_THREADS=1024"), "vec_{t}_z{z}_q2_t1024"),
    ],
)
def test_one_shape_of_the_wide_kernels_builds_alone(tmp_path, defines, shape):
    """ml/_wide.py builds logistic_wide.cu for the one shape a fit needs: its four kernels (two input
    and two sum types) and the shared ones, no other shape's."""
    lib = simt.build("logistic_wide", "", tmp_path, defines=defines)
    mine = {f"logit_wide_{shape.format(t=t, z=z)}" for t in ("f32", "f64") for z in ("32", "64")}
    shared = {"logit_wide_finish", "logit_wide_gram_sum_z32", "logit_wide_gram_sum_z64", "logit_wide_system",
              "logit_wide_next"}  # fmt: skip
    assert all(hasattr(lib, name) for name in mine | shared), sorted(n for n in mine | shared if not hasattr(lib, n))
    every = {name for source, name in _logistic_requests() if source == "logistic_wide"}
    assert len(every) == 36 and mine <= every
    assert not [name for name in every - mine if hasattr(lib, name)]
