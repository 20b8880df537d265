"""A 5.0 stored layout, measured as a prototype (issue 14): a no-op job's server cost through
today's library and through `benchmarks/layout5/proto.lua`, side by side.

    python benchmarks/layout5/cost.py [--n 20000] [--batch 10] [--maxlen 100000]
        [--keep 1000] [--layouts 4,5,5h] [--library FILE] [--reply rec|wide] [--callgrind]
        [--keep-dumps DIR]

One server of its own (the embedded one; with --callgrind under valgrind, as
benchmarks/server_cost.py, whose helpers this reuses). For each layout, on a queue of its own:
a first round of N jobs (so the retention and the event stream are in their steady state),
then N jobs measured phase by phase, as server_cost.py runs them: dispatch (calls of 1,000,
ids given: "<round>-<k>"), dequeue (--batch per FCALL, one client), finish (--batch acks per
FCALL, events and --keep ends kept). Layouts: 4 (the library as loaded, the bundled one or
--library FILE, e.g. tests/fixtures/queasy-4.4.0.lua to compare 4.4.0 with 5.0: queasy_dispatch,
queasy_dequeue with the reply 'rec' of 5.1.0, or with --reply wide the 8 values per job of
earlier libraries, queasy_finish), 5 (the prototype, records as fields of one hash per queue:
q5_*), 5h (the prototype, a record as a small hash per job: q5h_*). The same arguments go to
each. Printed per phase and layout: FCALL µs/job, the server process's CPU µs/job, the
commands run inside (calls/job), and with --callgrind the server's instructions per job.

Then, on the prototype only, a correctness check; it exits 1 when one fails: every job of
both rounds ended exactly once (its finish answered 0; its id in exactly one event line; the
stats count 2N), nothing left waiting, leased or recorded, the ends kept (--keep) and indexed,
and on a queue of its own: a duplicate of an active id blocked (3, then 4 updated), a stale
token and a second ack of one lease refused, the blocked job promoted when the active one
ends (with the data of its last dispatch), a dead client's lease swept back (stall_count 1),
and bad input refused with INVALID and nothing written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from benchmarks.server_cost import REPLIES, measure, server_for  # noqa: E402
from queasy_py.store.library import ensure_loaded, parse_version  # noqa: E402

PROTO = HERE / "proto.lua"
#: layout -> (the function names' prefix, what it is)
LAYOUTS = {
    "4": ("queasy_", "the library loaded (bundled, or --library)"),
    "5": ("q5_", "prototype: records in one hash per queue"),
    "5h": ("q5h_", "prototype: a small hash per record"),
}
NOW0 = 1_800_000_000_000


class Failed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def run_layout(r: redis.Redis, layout: str, args: argparse.Namespace, server: psutil.Process,
               grind) -> tuple[list[tuple[str, dict]], dict]:  # fmt: skip
    """Two rounds of N jobs through `layout` (the second measured); the rows and what the
    correctness check needs."""
    pre, n, batch = LAYOUTS[layout][0], args.n, args.batch
    # (the prototype replies id, token, record; the library as --reply asks: ARGV[8])
    form, width = REPLIES[args.reply] if layout == "4" else ("", 3)
    extra = ["", form] if layout == "4" else []  # (ARGV[7] '': no park)
    base = f"l{layout}:{{b}}:b"
    seen: dict[str, list] = {"codes": [], "leases": [], "ended": []}

    def dispatch(round_: int) -> Callable[[], None]:
        def step() -> None:
            for i in range(0, n, 1000):
                flat: list = []
                for k in range(i, min(n, i + 1000)):
                    flat += [f"{round_}-{k}", str(k), ""]
                codes = r.execute_command("FCALL", pre + "dispatch", 1, base, "", 1, "replace", 0,
                                          "", *flat)  # fmt: skip
                if any(c != 1 for c in codes):
                    raise SystemExit(f"{pre}dispatch answered {set(codes)}, not all created")

        return step

    def dequeue() -> None:
        k = 0
        while True:
            k += 1
            reply = r.execute_command(
                "FCALL", pre + "dequeue", 1, base, "", "c1", f"n{k}", batch, 60000, args.maxlen,
                *extra,
            )  # fmt: skip
            jobs = reply[2:]
            if not jobs:
                return
            seen["leases"].extend((jobs[j], jobs[j + 1]) for j in range(0, len(jobs), width))

    def finish() -> None:
        head = ["", "c1", args.maxlen, args.keep, 3600000, "bench-host", 0]
        leases, started = seen["leases"], str(NOW0)
        for i in range(0, len(leases), batch):
            flat = [x for job, token in leases[i : i + batch] for x in (job, token, 4242,
                                                                          started, "")]  # fmt: skip
            codes = r.execute_command("FCALL", pre + "finish", 1, base, *head, *flat)
            seen["codes"].extend(codes)
            seen["ended"].extend(job.decode() for job, _ in leases[i : i + batch])
            if any(codes):
                raise SystemExit(f"{pre}finish answered stale: {codes}")
        leases.clear()

    dispatch(0)(), dequeue(), finish()
    phases = [
        ("dispatch (calls of 1,000)", dispatch(1)),
        (f"dequeue ({batch} per FCALL)", dequeue),
        (f"finish ({batch} per FCALL)", finish),
    ]
    rows = [(name, measure(r, server, n, step, grind)) for name, step in phases]
    return rows, {"base": base, "codes": seen["codes"], "ended": seen["ended"]}


def check_run(r: redis.Redis, args: argparse.Namespace, base: str, codes: list[int],
              ended: list[str]) -> None:  # fmt: skip
    """Every job of the two rounds ended exactly once (`ended`: the ids in the order their
    finish calls ran), and what is kept is as asked: the newest ends."""
    n = args.n
    check(len(codes) == 2 * n and not any(codes), f"{len(codes)} finish codes for {2 * n} jobs")
    check(int(r.hget(base + ":stats", "finished") or 0) == 2 * n, "stats: finished is not 2N")
    for key, kind in ((":waiting", "zset"), (":rec", "hash"), (":lease:c1", "hash"),
                      (":blocked", "hash")):  # fmt: skip
        check(r.exists(base + key) == 0, f"{base}{key} ({kind}) is left after the run")
    check(not r.keys(base + ":job:*"), "records (B:job:<id>) are left after the run")
    # the retention drops whole calls' ends: keep - batch < kept <= keep
    kept, want = r.hlen(base + ":ends"), min(args.keep, 2 * n)
    check(want - args.batch < kept <= want, f"B:ends holds {kept}, not about {want}")
    index = [w.decode() for e in r.lrange(base + ":finished", 0, -1) for w in e.split()[1:]]
    check(sorted(index) == sorted(x.decode() for x in r.hkeys(base + ":ends")),
          "B:finished does not index the kept ends")  # fmt: skip
    check(sorted(ended) == sorted(f"{k // n}-{k % n}" for k in range(2 * n)), "ids ended")
    check(set(ended[len(ended) - kept :]) == set(index), "not the newest ends kept")
    if args.maxlen == 0:
        check(r.exists(base + ":events") == 0, "events written with maxlen 0")
        return
    entries = r.xrange(base + ":events")
    if len(entries) < 2 * n / args.batch:  # (MAXLEN ~ trimmed the first round's)
        return
    ids = [line.split(" ")[1] for _, f in entries for line in f[b"events"].decode().split("\n")]
    check(len(ids) == 2 * n and len(set(ids)) == 2 * n, "not one event line per job")


def check_guarantees(r: redis.Redis, pre: str) -> None:
    """A duplicate id blocked and promoted, stale tokens refused, a dead client swept, bad
    input refused with nothing written (on a queue of its own)."""
    b = f"g{pre}:{{g}}:g"
    now = NOW0

    def fcall(name: str, *argv) -> list:
        return r.execute_command("FCALL", pre + name, 1, b, *argv)

    def finish(t: int, *acks: tuple[str, str]) -> list:
        flat = [x for job, token in acks for x in (job, token, "", "", "")]
        return fcall("finish", t, "c1", 100, 10, 3600000, "h", 0, *flat)

    check(fcall("dispatch", now, 1, "replace", 0, "", "a", '"v1"', "") == [1], "dispatch a")

    def data(record: bytes) -> bytes:  # "<run_at> ... <timeout>\t<attempts>\t<trace>\t<data>"
        return record.split(b"\t", 3)[3]

    got = fcall("dequeue", now, "c1", "n1", 5, 60000, 100)
    check(got[2:4] == [b"a", b"n1.1"] and data(got[4]) == b'"v1"', f"dequeue a: {got}")
    check(fcall("dispatch", now, 1, "replace", 0, "", "a", '"v2"', "") == [3], "a blocked: 3")
    check(fcall("dispatch", now, 1, "replace", 0, "", "a", '"v3"', "") == [4], "a blocked: 4")
    check(fcall("dequeue", now, "c1", "n2", 5, 60000, 100)[2:] == [], "a blocked job leased")
    check(finish(now + 1, ("a", "n1.2"), ("a", "n1")) == [1, 1], "a stale token was taken")
    check(finish(now + 1, ("a", "n1.1"), ("a", "n1.1")) == [0, 1], "an ack twice in one call")
    got = fcall("dequeue", now + 2, "c1", "n3", 5, 60000, 100)
    check(got[2:4] == [b"a", b"n3.1"] and data(got[4]) == b'"v3"', f"a not promoted: {got}")
    check(r.hlen(b + ":blocked") == 0, "B:blocked holds a promoted job")
    check(finish(now + 3, ("a", "n3.1")) == [0], "the promoted a did not finish")
    check(r.hget(b + ":ends", "a").split(b" ")[4] == b"1", "a's end: not its first attempt")
    # a dead client's lease goes back to waiting, stalled once
    check(fcall("dispatch", now, 1, "replace", 0, "", "s", "1", "") == [1], "dispatch s")
    check(fcall("dequeue", now + 4, "dead", "d1", 5, 10, 100)[2] == b"s", "dequeue s")
    got = fcall("dequeue", now + 100, "c2", "m1", 5, 60000, 100)
    stall = got[4].split(b"\t")[0].split(b" ")[3] if len(got) > 4 else None
    check(got[2] == b"s" and stall == b"1", f"s was not swept back, stalled once: {got}")
    check(fcall("dequeue", now + 101, "dead", "d2", 5, 10, 100) == [2, b""], "dead not swept")
    flat = ["s", got[3], "", "", ""]
    check(fcall("finish", now + 102, "dead", 100, 10, 3600000, "h", 0, *flat) == [1], "dead's ack")
    check(fcall("finish", now + 102, "c2", 100, 10, 3600000, "h", 0, *flat) == [0], "c2's ack")
    check(r.hget(b + ":ends", "s").split(b" ")[4] == b"2", "s's end: not its second attempt")
    # bad input: INVALID, nothing written
    before = sorted(r.keys(b + "*"))
    for argv in (
        ("dispatch", now, 1, "replace", 0, "", "bad id", "1", ""),
        ("dispatch", now, 1, "replace", 0, "", "x", "{nope", ""),
        ("dispatch", now, 1, "replace", 0, "", "x", "NaN", ""),
        ("dispatch", now, 1, "sometimes", 0, "", "x", "1", ""),
        ("dispatch", now, 1, "replace", 0, "", "x", "1", "1.5"),
        ("dequeue", now, "c 1", "n", 5, 60000, 100),
        ("finish", now, "c1", 100, 10, 3600000, "h", 0, "a", "t", "x", "", ""),
        ("finish", now, "c1", 100, 10, 3600000, "h", 0, "a", "t", "", "", "{bad"),
    ):
        try:
            fcall(*argv)
        except redis.ResponseError as exc:
            check(str(exc).startswith("INVALID"), f"{argv[0]} refused without INVALID: {exc}")
        else:
            raise Failed(f"{argv} was not refused")
    check(sorted(r.keys(b + "*")) == before, "a refused call wrote")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=10, help="jobs per dequeue and finish")
    parser.add_argument("--maxlen", type=int, default=100000, help="event entries kept (0: none)")
    parser.add_argument("--keep", type=int, default=1000, help="finished ends kept")
    parser.add_argument("--layouts", default="4,5,5h", help="of 4, 5, 5h (comma-separated)")
    parser.add_argument("--library", metavar="FILE",
                        help="layout 4: this library file instead of the bundled lua/queasy.lua"
                        " (e.g. tests/fixtures/queasy-4.4.0.lua, to compare with it)")  # fmt: skip
    parser.add_argument("--reply", choices=sorted(REPLIES), default="rec",
                        help="layout 4, dequeue's reply: rec (id, token, record: library 5.1.0)"
                        " or wide (8 values per job, as before 5.1.0)")  # fmt: skip
    parser.add_argument("--callgrind", action="store_true", help="count instructions too")
    parser.add_argument("--keep-dumps", metavar="DIR",
                        help="with --callgrind: keep the dumps in DIR (per layout, in order:"
                        " an even dump per phase: dispatch, dequeue, finish)")  # fmt: skip
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    if not layouts or any(x not in LAYOUTS for x in layouts):
        parser.error(f"--layouts: each of {', '.join(LAYOUTS)}, got {args.layouts!r}")
    if args.n < 1 or args.batch < 1 or args.batch > 1000:
        parser.error("--n must be >= 1 and --batch 1..1000")
    failures: list[str] = []
    results: dict[str, list[tuple[str, dict]]] = {}
    with server_for(args) as (url, pid, grind), redis.Redis.from_url(url) as r:
        ensure_loaded(r)
        if args.library:
            r.function_load(Path(args.library).read_text(), replace=True)
        library = r.fcall("queasy_library", 0).decode()
        if "4" in layouts and args.reply == "rec" and parse_version(library.split(" ")[1]) < (5, 1):
            parser.error(f"--reply rec needs library 5.1.0 or later, not {library}: --reply wide")
        r.function_load(PROTO.read_text(), replace=True)
        server = psutil.Process(pid)
        for layout in layouts:
            rows, seen = run_layout(r, layout, args, server, grind)
            results[layout] = rows
            if layout == "4":
                continue
            try:
                check_run(r, args, seen["base"], seen["codes"], seen["ended"])
                check_guarantees(r, LAYOUTS[layout][0])
            except Failed as exc:
                failures.append(f"layout {layout}: {exc}")
    print(f"{args.n:,} no-op jobs, {args.batch} per dequeue/finish, maxlen {args.maxlen},"
          f" keep {args.keep}; layout 4 is the library {library} (dequeue's reply"
          f" {args.reply})")  # fmt: skip
    print()
    grind_col = " instructions/job |" if grind else ""
    print(f"| layout | phase | FCALL µs/job | process CPU µs/job | commands run inside, calls/job"
          f" |{grind_col}")  # fmt: skip
    print("|---|---|---:|---:|---|" + ("---:|" if grind else ""))
    for layout, rows in results.items():
        total = [0.0, 0.0, 0.0, 0.0]
        for name, m in rows:
            inner = sorted(m["inner"].items(), key=lambda kv: (-kv[1][0], kv[0]))
            shown = ", ".join(f"{k} {c:.2f}" for k, (c, _) in inner if c >= 0.005)
            calls = sum(c for c, _ in m["inner"].values())
            ins = m["instructions"] or 0.0
            total = [total[0] + m["fcall_us"], total[1] + m["cpu_us"], total[2] + calls,
                     total[3] + ins]  # fmt: skip
            extra = f" {ins / 1000:,.1f}k |" if grind else ""
            print(f"| {layout} | {name} | {m['fcall_us']:.1f} | {m['cpu_us']:.1f} |"
                  f" {calls:.2f}: {shown} |{extra}")  # fmt: skip
        extra = f" **{total[3] / 1000:,.1f}k** |" if grind else ""
        print(f"| **{layout}** | **a job's path** | **{total[0]:.1f}** | **{total[1]:.1f}** |"
              f" **{total[2]:.2f}** |{extra}")  # fmt: skip
    print()
    if failures:
        for failure in failures:
            print(f"CHECK FAILED: {failure}", file=sys.stderr)
        return 1
    checked = [x for x in layouts if x != "4"]
    if checked:
        print(f"correctness check passed: layouts {', '.join(checked)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
