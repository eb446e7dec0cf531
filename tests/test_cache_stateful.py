"""A stateful property test of the kernel cache (hypothesis): random sequences of put, get, get_or_build,
corrupt, plant (an entry copied under another key), evict and clear, some of the puts made by a second
process on the same folder. Invariants: a hit returns the requested key's kernel and nothing else; no file
outside the cache root is touched, nor a user's file inside it; nothing is left half-written in ``tmp/``.
The kernels are small fake ops stored through the cache's own API (no IREE compile): a few seconds."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from convbw_mlir.build.artifact import CompiledOp
from convbw_mlir.dispatch import KernelCache
from convbw_mlir.dispatch.variants import request_key
from convbw_mlir.problem import ConvBwdWeightProblem

PROBLEMS = [ConvBwdWeightProblem.from_ck(f"1 1 2 {c} 4 3 8 1 1 0 0") for c in (4, 8, 12, 16)]
# Synthetic requests: the cache checks a hit against what its key hashes, whatever the request holds.
REQUESTS = [json.loads(json.dumps({"problem": p.to_dict(), "target": "host", "i": i})) for i, p in enumerate(PROBLEMS)]
KEYS = [request_key(r) for r in REQUESTS]
SLOTS = st.integers(0, len(PROBLEMS) - 1)


def fake_op(i: int, tag: str) -> CompiledOp:
    return CompiledOp(PROBLEMS[i], "host", {"linalg": f"// {tag}\n"}, tag.encode() * 300, tag, [f"--{tag}"], "3")


def _worker(root: str, conn) -> None:  # the second process: puts on its own KernelCache of the same folder
    kc = KernelCache(root)
    while (msg := conn.recv()) is not None:
        i, tag = msg
        kc.put(KEYS[i], fake_op(i, tag), request=REQUESTS[i])
        conn.send("ok")


def _tree(folder: Path) -> dict[str, tuple[bytes, float]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime) for p in folder.rglob("*") if p.is_file()}


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="convbw-stateful-"))
        (self.base / "outside").mkdir()
        (self.base / "outside" / "thesis.tex").write_text("mine")
        self.outside = _tree(self.base / "outside")
        self.kc = KernelCache(self.base / "cache", max_bytes=1 << 30)
        assert self.kc.get(KEYS[0]) is None  # makes and tags the root
        (self.kc.root / "notes.txt").write_text("mine")  # a user's file in the cache root: never removed
        self.model: dict[int, str] = {}  # slot -> tag of the entry that must be served
        self.count = 0
        self.conn, child = multiprocessing.get_context("fork").Pipe()
        self.proc = multiprocessing.get_context("fork").Process(target=_worker, args=(str(self.kc.root), child))
        self.proc.start()

    def teardown(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)
        shutil.rmtree(self.base, ignore_errors=True)

    def _tag(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def _entry(self, i: int) -> Path:
        return self.kc.root / "entries" / KEYS[i][:2] / KEYS[i]

    def _sync_after_removal(self) -> None:
        self.model = {i: t for i, t in self.model.items() if (self._entry(i) / "meta.json").exists()}

    @rule(i=SLOTS)
    def put(self, i: int) -> None:
        tag = self._tag()
        self.kc.put(KEYS[i], fake_op(i, tag), request=REQUESTS[i])
        self.model[i] = tag

    @rule(i=SLOTS)
    def put_from_another_process(self, i: int) -> None:
        tag = self._tag()
        self.conn.send((i, tag))
        assert self.conn.recv() == "ok"
        self.model[i] = tag

    @rule(i=SLOTS)
    def get(self, i: int) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op = self.kc.get(KEYS[i])
        if i in self.model:
            assert op is not None and op.pipeline == self.model[i] and op.problem == PROBLEMS[i]
        else:
            assert op is None

    @rule(i=SLOTS)
    def get_or_build(self, i: int) -> None:
        tag = self._tag()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op, hit = self.kc.get_or_build(KEYS[i], lambda: fake_op(i, tag), request=REQUESTS[i])
        assert hit == (i in self.model) and op.problem == PROBLEMS[i]
        assert op.pipeline == (self.model[i] if hit else tag)
        self.model[i] = op.pipeline

    @precondition(lambda self: self.model)
    @rule(data=st.data(), how=st.sampled_from(["truncate", "delete", "not json", "files", "problem", "target"]))
    def corrupt(self, data, how: str) -> None:
        i = data.draw(st.sampled_from(sorted(self.model)))
        entry = self._entry(i)
        meta = json.loads((entry / "meta.json").read_text())
        if how == "truncate":
            (entry / "kernel.vmfb").write_bytes(b"x")
        elif how == "delete":
            (entry / "linalg.mlir").unlink()
        elif how == "not json":
            (entry / "meta.json").write_text("{")
        else:
            (entry / "meta.json").write_text(json.dumps({**meta, how: {"files": [], "problem": [], "target": 5}[how]}))
        del self.model[i]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), i=SLOTS)
    def plant(self, data, i: int) -> None:
        j = data.draw(st.sampled_from(sorted(self.model)))
        if i == j:
            return
        shutil.rmtree(self._entry(i), ignore_errors=True)
        self._entry(i).parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self._entry(j), self._entry(i))
        self.model.pop(i, None)  # another key's kernel there: it must never be served for i

    @rule(limit=st.integers(1, 8000))
    def evict(self, limit: int) -> None:
        self.kc.max_bytes = limit
        try:
            self.kc.evict()
        finally:
            self.kc.max_bytes = 1 << 30
        self._sync_after_removal()

    @rule()
    def clear(self) -> None:
        self.kc.clear()
        self.model = {}

    @invariant()
    def nothing_outside_is_touched_and_nothing_is_half_written(self) -> None:
        assert _tree(self.base / "outside") == self.outside
        assert sorted(os.listdir(self.base)) == ["cache", "outside"]
        assert (self.kc.root / "notes.txt").read_text() == "mine"
        assert os.listdir(self.kc.root / "tmp") == []


CacheMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_kernel_cache_state_machine = CacheMachine.TestCase
