"""A time-stepped model of one fa_mla CTA's schedule at 64-key tiles in a two-slot ring (docs/mla.md, session 7).

The schedules it names were built, measured on the GPU and then taken out of the tree (their records name the commits).

Warpgroups are generators of operations (wait for an event, run for a while on their own issue ports, issue a
wgmma group, wait for one); the tensor cores are shared equally by the wgmma groups in flight; a TMA refill of a
slot lands ``L`` after the slot is released by both P.V warpgroups. Inputs, all in microseconds and measured on an
H100 (docs/mla.md): a 64-key QK alone 0.72 (scripts/mla_qk_probe.py), a 64 x 256 x 64 P.V half 0.30 (the P.V
share of the tile's 1.3 us of tensor work), the S warpgroup's softmax and hand-over 0.52 (26% of a 2.0 us tile in
the Nsight Compute profile), a barrier round trip 0.02. ``L`` is not measured directly; the profile's "loaded"
wait (7% of the S warpgroup's samples in kv64_ws_mc) puts it near 1.1 us in this model.

Usage: python scripts/mla_schedule_model.py  (prints microseconds per tile for each schedule and L)
"""

from __future__ import annotations

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

DT = 0.002


class Model:
    def __init__(self, load_us: float, qk: float = 0.72, pv_half: float = 0.30, softmax: float = 0.52,
                 ntiles: int = 64, slots: int = 2, bar: float = 0.02, fifo: bool = False,
                 queue_us: float | None = None):
        self.L, self.QK, self.PV, self.X, self.n, self.slots, self.bar = load_us, qk, pv_half, softmax, ntiles, \
            slots, bar
        self.fifo, self.queue_us = fifo, queue_us
        self.t = 0.0
        self.ev: dict = {}
        self.mma: dict = {}
        self.order: list = []

    def ahead(self, key) -> float:
        """Tensor work queued before ``key`` (issue order) plus ``key``'s own remaining work."""
        total = 0.0
        for k in self.order:
            total += max(self.mma[k], 0.0)
            if k == key:
                return total
        return 0.0

    def done(self, key) -> bool:
        return key in self.ev and self.ev[key] <= self.t

    def wait(self, key):
        return ("wait", lambda: self.done(key))

    def run(self, procs) -> float:
        procs = list(procs)
        state = [None] * len(procs)
        busy = [0.0] * len(procs)
        while any(p is not None for p in procs) and self.t < 1e5:
            for i, p in enumerate(procs):
                while p is not None:
                    st = state[i]
                    if st is not None:
                        kind, arg = st
                        if kind == "wait" and not arg():
                            break
                        if kind == "cpu" and busy[i] > 0:
                            busy[i] -= DT
                            break
                        if kind == "mwait" and self.mma.get(arg, 0) > 0:
                            break
                        if kind == "issuing" and self.ahead(arg) > self.queue_us:
                            break
                    try:
                        op = next(p)
                    except StopIteration:
                        procs[i] = p = None
                        break
                    state[i] = None
                    if op[0] == "issue":
                        self.mma[op[1]] = op[2]
                        self.order.append(op[1])
                        if self.queue_us is not None:  # the warp stays in the issue until the queue takes it
                            state[i] = ("issuing", op[1])
                    elif op[0] == "load":
                        self.ev[("land", op[1])] = self.t + self.L
                    elif op[0] == "set":
                        self.ev.setdefault(op[1], self.t)
                    elif op[0] == "cpu":
                        busy[i] = op[1]
                        state[i] = ("cpu", None)
                    else:
                        state[i] = op
            active = [k for k in self.order if self.mma[k] > 0]
            if self.fifo and active:
                self.mma[active[0]] -= DT
            for k in ([] if self.fifo else active):
                self.mma[k] -= DT / len(active)
            self.t += DT
        return self.t


def loader(m: Model):
    for j in range(min(m.n, m.slots)):
        yield ("load", j)
    for j in range(m.slots, m.n):
        yield m.wait(("free", j - m.slots, 1))
        yield m.wait(("free", j - m.slots, 2))
        yield ("load", j)


def pv(m: Model, w: int):
    for j in range(m.n):
        yield m.wait(("land", j))
        yield m.wait(("p", j))
        yield ("cpu", 0.03)  # the O rescale
        yield ("issue", ("pv", j, w), m.PV)
        if w == 2:
            yield ("set", ("pv_issued", j))  # (kv64_ws_pvf's barrier; both halves are issued together)
        yield ("mwait", ("pv", j, w))
        yield ("cpu", m.bar)
        yield ("set", ("free", j, w))


def softmax_publish(m: Model, j: int):
    """The softmax of tile j, then P_j published once P_{j-1} is released (one P buffer)."""
    yield ("cpu", m.X)
    if j:
        yield m.wait(("free", j - 1, 1))
        yield m.wait(("free", j - 1, 2))
    yield ("cpu", m.bar)
    yield ("set", ("p", j))


def s_serial(m: Model):
    """kv64_ws: QK_s, its softmax, P_s published (one P buffer: P_{s-1} must be released first)."""
    for j in range(m.n):
        yield m.wait(("land", j))
        yield ("issue", ("qk", j), m.QK)
        yield ("mwait", ("qk", j))
        yield from softmax_publish(m, j)


def s_pv_first(m: Model):
    """kv64_ws_pvf: kv64_ws with the QK of tile s issued only once P.V_{s-1} has been issued."""
    for j in range(m.n):
        yield m.wait(("land", j))
        if j:
            yield m.wait(("pv_issued", j - 1))
        yield ("issue", ("qk", j), m.QK)
        yield ("mwait", ("qk", j))
        yield from softmax_publish(m, j)


def s_pipelined(m: Model):
    """kv32_ws's order at 64 keys: the QK of s + 1 issued before the softmax of s (which waits for tile s + 1)."""
    yield m.wait(("land", 0))
    yield ("issue", ("qk", 0), m.QK)
    yield ("mwait", ("qk", 0))
    for j in range(m.n):
        if j + 1 < m.n:
            yield m.wait(("land", j + 1))
            yield ("issue", ("qk", j + 1), m.QK)
        yield from softmax_publish(m, j)
        if j + 1 < m.n:
            yield ("mwait", ("qk", j + 1))


def s_pairs(m: Model):
    """kv64_pair: QK_a and QK_b back to back; softmax_a beside QK_b, P_a published; softmax_b beside P.V_a."""
    for a in range(0, m.n, 2):
        b = a + 1
        yield m.wait(("land", a))
        yield ("issue", ("qk", a), m.QK)
        if b < m.n:
            yield m.wait(("land", b))
            yield ("issue", ("qk", b), m.QK)
        yield ("mwait", ("qk", a))
        yield ("cpu", m.X + m.bar)
        yield ("set", ("p", a))
        if b < m.n:
            yield ("mwait", ("qk", b))
            yield ("cpu", m.X + m.bar)
            yield ("set", ("p", b))


def s_qk_first(m: Model):
    """kv64_ws3 (three slots, Q in the S warpgroup's registers): the QK of tile s is issued before P_{s-1} is
    published, so the P.V of s - 1 queues behind it and runs beside the softmax of s."""
    for j in range(m.n):
        yield m.wait(("land", j))
        yield ("issue", ("qk", j), m.QK)
        if j:
            if j > 1:
                yield m.wait(("free", j - 2, 1))  # one P buffer: P_{j-2} released before P_{j-1} was stored
                yield m.wait(("free", j - 2, 2))
            yield ("cpu", m.bar)
            yield ("set", ("p", j - 1))
        yield ("mwait", ("qk", j))
        yield ("cpu", m.X)
    yield ("cpu", m.bar)
    yield ("set", ("p", m.n - 1))


def seesaw(m: Model, w: int):
    """kv64_seesaw, math warpgroup w (two in all, each owning one DV half of O and no separate P.V warpgroups): tile t's
    S and softmax run on warpgroup t % 2, the other's QK queued behind it (warpgroup 1 issues after warpgroup 0 has),
    so one warpgroup's softmax runs beside the other's QK; each then accumulates both tiles of the pair in order."""
    for i in range(0, m.n, 2):
        t = i + w
        if t < m.n:
            yield m.wait(("land", t))
            if w == 1:
                yield m.wait(("qk_issued", t - 1))
            yield ("issue", ("qk", t), m.QK)
            if w == 0:
                yield ("set", ("qk_issued", t))
            yield ("mwait", ("qk", t))
            if t:
                yield m.wait(("p", t - 1))  # the running max of tile t - 1
            yield ("cpu", m.X + m.bar)
            yield ("set", ("p", t))
        for u in (i, i + 1):
            if u >= m.n:
                break
            yield m.wait(("p", u))
            yield ("cpu", 0.03)
            yield ("issue", ("pv", u, w), m.PV)
            yield ("mwait", ("pv", u, w))
            yield ("set", ("free", u, w + 1))


def main() -> None:
    schedules = (("kv64_ws (serial)", s_serial), ("kv64_ws_pvf", s_pv_first), ("s_pipelined", s_pipelined),
                 ("kv64_pair", s_pairs), ("kv64_seesaw", None), ("kv64_ws3 (3 slots)", s_qk_first),
                 ("kv64_ws, 3 slots", s_serial))
    pipes = (("shared tensor pipe, asynchronous issue", {}),
             ("FIFO tensor pipe, issue blocks until <= 0.1 us of work is queued ahead", {"fifo": True,
                                                                                          "queue_us": 0.1}))
    for title, kw in pipes:
        print(f"{title}\nL (us) | " + " | ".join(name for name, _ in schedules) + "   [us per 64-key tile]")
        for load_us in (0.7, 1.1, 1.45, 1.6):
            row = []
            for name, sched in schedules:
                m = Model(load_us, slots=3 if "3 slots" in name else 2, **kw)
                procs = [seesaw(m, 0), seesaw(m, 1), loader(m)] if sched is None else \
                    [sched(m), pv(m, 1), pv(m, 2), loader(m)]
                row.append(m.run(procs) / m.n)
            print(f"{load_us:5.2f}  | " + " | ".join(f"{t:.2f}" for t in row))


if __name__ == "__main__":
    main()
