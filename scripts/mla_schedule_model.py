"""A time-stepped model of one fa_mla CTA's schedule at 64-key tiles in a two-slot ring (docs/mla.md, "kv64_pair").

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

DT = 0.002


class Model:
    def __init__(self, load_us: float, qk: float = 0.72, pv_half: float = 0.30, softmax: float = 0.52,
                 ntiles: int = 64, slots: int = 2, bar: float = 0.02):
        self.L, self.QK, self.PV, self.X, self.n, self.slots, self.bar = load_us, qk, pv_half, softmax, ntiles, \
            slots, bar
        self.t = 0.0
        self.ev: dict = {}
        self.mma: dict = {}

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
                    try:
                        op = next(p)
                    except StopIteration:
                        procs[i] = p = None
                        break
                    state[i] = None
                    if op[0] == "issue":
                        self.mma[op[1]] = op[2]
                    elif op[0] == "load":
                        self.ev[("land", op[1])] = self.t + self.L
                    elif op[0] == "set":
                        self.ev.setdefault(op[1], self.t)
                    elif op[0] == "cpu":
                        busy[i] = op[1]
                        state[i] = ("cpu", None)
                    else:
                        state[i] = op
            active = [k for k, v in self.mma.items() if v > 0]
            for k in active:
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
        yield ("mwait", ("pv", j, w))
        yield ("cpu", m.bar)
        yield ("set", ("free", j, w))


def s_serial(m: Model):
    """kv64_ws: QK_s, its softmax, P_s published (one P buffer: P_{s-1} must be released first)."""
    for j in range(m.n):
        yield m.wait(("land", j))
        yield ("issue", ("qk", j), m.QK)
        yield ("mwait", ("qk", j))
        yield ("cpu", m.X)
        if j:
            yield m.wait(("free", j - 1, 1))
            yield m.wait(("free", j - 1, 2))
        yield ("cpu", m.bar)
        yield ("set", ("p", j))


def s_pipelined(m: Model):
    """kv32_ws's order at 64 keys: the QK of s + 1 issued before the softmax of s (which waits for tile s + 1)."""
    yield m.wait(("land", 0))
    yield ("issue", ("qk", 0), m.QK)
    yield ("mwait", ("qk", 0))
    for j in range(m.n):
        if j + 1 < m.n:
            yield m.wait(("land", j + 1))
            yield ("issue", ("qk", j + 1), m.QK)
        yield ("cpu", m.X)
        if j:
            yield m.wait(("free", j - 1, 1))
            yield m.wait(("free", j - 1, 2))
        yield ("cpu", m.bar)
        yield ("set", ("p", j))
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


def main() -> None:
    schedules = (("kv64_ws (serial)", s_serial), ("s_pipelined", s_pipelined), ("kv64_pair", s_pairs))
    print("L (us) | " + " | ".join(name for name, _ in schedules) + "   [us per 64-key tile]")
    for load_us in (0.5, 0.7, 0.9, 1.1, 1.3, 1.6):
        row = []
        for _, sched in schedules:
            m = Model(load_us)
            row.append(m.run([sched(m), pv(m, 1), pv(m, 2), loader(m)]) / m.n)
        print(f"{load_us:5.1f}  | " + " | ".join(f"{t:.2f}" for t in row))


if __name__ == "__main__":
    main()
