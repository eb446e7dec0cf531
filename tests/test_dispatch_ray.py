"""Builds on Ray (``convbw tune --engine ray``): each compile a Ray task on a local Ray of two CPUs, the
crash isolation kept inside the task, the output folder the same bytes as the local engine's."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import zipfile

import pytest

from convbw_mlir.cli import main
from convbw_mlir.dispatch import KernelCache, Registry, Variant, row_chunk_variant
from convbw_mlir.dispatch.engine import EngineError, check_engine, run_tasks
from convbw_mlir.dispatch.tune import compile_candidates
from convbw_mlir.plan import decide
from convbw_mlir.problem import ConvBwdWeightProblem

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'convbw-mlir[ray]'; make setup has it)")

TINY = [
    ("tiny-3x3", ConvBwdWeightProblem.from_ck("2 1 2 8 8 3 3 6 6 1 1 1 1 1 1 1 1"), False),
    ("tiny-1x1", ConvBwdWeightProblem.from_ck("2 1 2 8 16 1 1 5 5 1 1 1 1 0 0 0 0"), True),
]


def _folder(path):
    """Every file of a candidate folder (the manifest without the build's own record: wall time, engine)."""
    files = {f.name: f.read_bytes() for f in path.iterdir()}
    manifest = json.loads(files.pop("manifest.json"))
    return manifest.pop("build"), manifest, files


def _same_kernel(a: bytes, b: bytes) -> bool:
    """Two vmfbs alike but for IREE's own per-compile bytes: the VM module identical, each embedded host ELF
    of the same size and differing only in one 32-bit word an export, 16 bytes apart (IREE 3.13 writes a
    value there that differs between two compiles of one variant in one process: docs/dispatch.md#ray)."""
    za, zb = zipfile.ZipFile(io.BytesIO(a)), zipfile.ZipFile(io.BytesIO(b))
    if za.namelist() != zb.namelist():
        return False
    for name in za.namelist():
        x, y = za.read(name), zb.read(name)
        words = sorted({i // 4 * 4 for i in range(min(len(x), len(y))) if x[i] != y[i]})
        if len(x) != len(y) or (words and not (name.endswith(".so") and all((w - words[0]) % 16 == 0 for w in words))):
            return False
    return True


def test_ray_engine_fills_the_output_folder_as_the_local_engine_does(tmp_path):
    quiet = {"max_workers": 2, "max_plans": 1, "progress": False, "log": lambda _: None}
    local = compile_candidates(TINY, "host", tmp_path / "local", cache=KernelCache(tmp_path / "c1"), **quiet)
    on_ray = compile_candidates(
        TINY, "host", tmp_path / "ray", cache=KernelCache(tmp_path / "c2"), engine="ray", **quiet
    )
    assert not ray.is_initialized()  # the local Ray it started for the build is stopped
    build_local, manifest_local, files_local = _folder(tmp_path / "local")
    build_ray, manifest_ray, files_ray = _folder(tmp_path / "ray")
    assert (build_local["engine"], build_ray["engine"]) == ("local", "ray")
    assert manifest_ray == manifest_local
    assert files_ray.keys() == files_local.keys() and sum(n.endswith(".vmfb") for n in files_ray) >= 4
    assert all(files_ray[n] == files_local[n] or _same_kernel(files_ray[n], files_local[n]) for n in files_ray)
    assert all(r.ok and not r.hit for r in on_ray.results), on_ray.table()
    here = f"{os.uname().nodename}:{os.getpid()}"
    assert {r.worker for r in local.results} == {here}  # threads of this process
    assert here not in {r.worker for r in on_ray.results}  # Ray's worker processes
    assert "| ray | 2 |" in on_ray.table()


def test_an_iree_crash_inside_a_ray_task_costs_that_variant_only(tmp_path):
    one = ConvBwdWeightProblem.from_ck("2 1 1 8 8 3 3 16 16 1 1 1 1 1 1 1 1")
    reg = Registry("host", KernelCache(tmp_path / "cache"))
    crash = row_chunk_variant(one, "host", 4)  # IREE 3.13 segfaults on output-row chunks
    good = Variant("convbw", decide(one, "host"))
    reg.declare(one, crash)
    reg.declare(one, good)
    report = reg.build(max_workers=2, progress=False, engine="ray")
    by = {r.variant: r for r in report.results}
    assert not by[crash].ok and "SIGSEGV" in by[crash].error
    assert by[good].ok, by[good].error


def _exit_if(code: int) -> int:
    if code:
        os._exit(code)  # the Ray worker process itself dies (not a child): as when a node is lost mid-task
    return code


def test_a_task_whose_ray_worker_dies_is_an_engine_error_for_that_task_only():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers do not import tests/
    results = dict(run_tasks(_exit_if, [(0,), (3,), (0,)], engine="ray", workers=2))
    assert results[0] == results[2] == 0
    assert isinstance(results[1], EngineError) and str(results[1]).startswith("ray lost task 1 (_exit_if): ")


def test_a_lost_task_is_recorded_as_its_variants_failure(monkeypatch, tmp_path):
    from convbw_mlir.dispatch import engine

    one = TINY[0][1]
    reg = Registry("host", KernelCache(tmp_path / "cache"))
    reg.declare(one, Variant("convbw", decide(one, "host")))
    monkeypatch.setattr(engine, "run_tasks", lambda *a: iter([(0, EngineError("ray lost task 0 (build_one): gone"))]))
    (r,) = reg.build(progress=False, engine="ray").results
    assert not r.ok and r.error == "ray lost task 0 (build_one): gone"


def test_a_build_into_a_new_cache_folder_tags_it_before_any_task_starts(monkeypatch, tmp_path):
    from convbw_mlir.dispatch import engine

    seen = []

    def tasks(fn, jobs, *rest):
        seen.append((tmp_path / "new" / "CACHEDIR.TAG").is_file())
        return iter([])

    reg = Registry("host", KernelCache(tmp_path / "new"))
    monkeypatch.setattr(engine, "run_tasks", tasks)
    reg.build(progress=False)
    assert seen == [True]


@pytest.mark.parametrize(
    ("engine", "address", "message"),
    [
        ("spark", None, "engine: expected one of local, ray, got 'spark'"),
        ("local", "10.0.0.1:6379", "address: '10.0.0.1:6379' applies to engine ray only (engine: local)"),
        ("ray", " ", "address: expected a Ray address"),
    ],
)
def test_a_bad_engine_or_address_is_one_error_naming_it(engine, address, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_engine(engine, address)


def test_engine_ray_without_ray_installed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray then fails, as where it is not installed
    with pytest.raises(
        ValueError, match=r"engine: ray needs Ray, which is not installed \(pip install 'convbw-mlir\[ray\]'\)"
    ):
        check_engine("ray")


def test_cli_address_without_engine_ray_is_one_line_and_builds_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["tune", "--suite", "seeds", "--target", "host", "--compile-only", "--out", str(out), "--address", "auto"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == "convbw: error: address: 'auto' applies to engine ray only (engine: local)\n"
    assert not out.exists()


def test_a_cache_sent_to_another_machine_makes_its_folder_there(tmp_path):
    import pickle

    from convbw_mlir.dispatch.build import build_one

    cache = KernelCache(tmp_path / "cache")
    cache._setup()  # the caller's machine: made and tagged before the tasks start
    sent = pickle.dumps(cache)
    (tmp_path / "cache" / "CACHEDIR.TAG").unlink()  # a node where none of it exists
    for sub in ("entries", "locks", "tmp"):
        (tmp_path / "cache" / sub).rmdir()
    (tmp_path / "cache").rmdir()
    one = TINY[0][1]
    r = build_one(one, "host", Variant("convbw", decide(one, "host")), pickle.loads(sent), None)
    assert r.ok and (tmp_path / "cache" / "CACHEDIR.TAG").is_file() and any((tmp_path / "cache" / "entries").iterdir())


ONE_SEED = ["tune", "--suite", "seeds", "--filter", "streamk_3x3_512_n2_7", "--target", "host", "--compile-only"]


def test_an_unreachable_address_is_one_error_naming_it_within_seconds(tmp_path):
    import subprocess
    import time

    out = tmp_path / "out"
    argv = [*ONE_SEED, "--engine", "ray", "--address", "127.0.0.1:1", "--out", str(out)]
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "convbw_mlir", *argv], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 30  # Ray's own retries take ~12 minutes
    assert done.returncode == 1, done.stderr
    assert "error: address: '127.0.0.1:1': cannot connect to a Ray cluster: Connection refused" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()


def _serve_once(reply: bytes):
    """A loopback port that accepts one connection and answers ``reply`` (or nothing): not a Ray cluster."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def answer():
        conn, _ = server.accept()
        with conn, contextlib.suppress(OSError):
            if reply:
                conn.sendall(reply)
            while conn.recv(64):  # until the client gives up
                pass

    threading.Thread(target=answer, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize(
    ("reply", "why"),
    [(b"", "no answer within 0.5 s"), (b"HTTP/1.1 400 Bad Request\r\n\r\n", "it answered, but not as a Ray cluster")],
)
def test_a_port_that_is_not_ray_is_refused_within_the_connect_timeout(reply, why):
    import time

    from convbw_mlir.dispatch.engine import probe_ray_address

    server, address = _serve_once(reply)
    with server:
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=f"address: '{address}': cannot connect to a Ray cluster: {why}"):
            probe_ray_address(address, timeout=0.5)
        assert time.monotonic() - t0 < 5


def test_a_running_ray_cluster_passes_the_connect_check():
    from convbw_mlir.dispatch.engine import probe_ray_address, session

    with session("ray", 1):
        gcs = ray.get_runtime_context().gcs_address
        probe_ray_address(gcs, timeout=5)
        probe_ray_address(f"ray://{gcs}", timeout=5)  # the same port check for a Ray Client address


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_cli_workers_below_one_is_one_error_naming_it_before_ray_starts(monkeypatch, tmp_path, capsys, workers):
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init called"))
    out = tmp_path / "out"
    argv = [*ONE_SEED, "--engine", "ray", "--workers", workers, "--out", str(out)]
    assert main(argv) == 1
    assert capsys.readouterr().err == f"convbw: error: convbw tune: argument --workers: must be >= 1, got {workers}\n"
    assert not out.exists()


@pytest.mark.parametrize("workers", [0, -1, True, 2.0])
def test_api_workers_below_one_is_refused_before_ray_starts(monkeypatch, tmp_path, workers):
    from convbw_mlir.dispatch.engine import session

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init called"))
    match = f"workers: expected a positive integer, got {workers!r}"
    with pytest.raises(ValueError, match=match):
        compile_candidates(TINY, "host", tmp_path / "out", max_workers=workers, engine="ray", log=lambda _: None)
    with pytest.raises(ValueError, match=match), session("ray", workers):
        pass
    assert not (tmp_path / "out").exists()
