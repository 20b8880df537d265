"""Where a phase's server instructions go, by C function: the split of a callgrind dump.

    python benchmarks/server_cost.py --n 2000 --callgrind --keep-dumps /tmp/cg
    python benchmarks/callgrind_split.py --n 2000 /tmp/cg/cg.out.2 /tmp/cg/cg.out.4 \
        /tmp/cg/cg.out.6

Reads each dump with `callgrind_annotate --inclusive=yes` and prints, per job (the dump's
instructions divided by --n), a Markdown table with one column per dump: the FCALL as a
whole; the Lua function it runs; its `redis.call`s, split into the commands as the server
runs them (`call()`: the command proc, its keyspace lookups, its reply into the script
client's buffer) and the scripting glue around them (Lua arguments to an argv, the command's
lookup and ACL check, the reply parsed back into Lua values); and the Lua side (the function
less its redis.calls): the interpreter (luaV_execute's own instructions), string patterns
(string.find/match), concatenation, table creation, the garbage collector's steps. Inclusive
counts overlap where one calls another (a GC step run while a reply's string is made is
counted in the reply's conversion too), so the parts need not add up to their whole.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

#: (label, functions whose inclusive counts add up to it; exclusive=True: own instructions)
ROWS: list[tuple[str, tuple[str, ...], bool]] = [
    ("the whole phase (all the server ran)", ("PROGRAM TOTALS",), False),
    ("FCALL (fcallCommand)", ("fcallCommand",), False),
    ("the Lua function (luaCallFunction)", ("luaCallFunction",), False),
    ("redis.call, all (luaServerGenericCommand)", ("luaServerGenericCommand",), False),
    ("- the commands as run (call(): proc, lookups, reply)", ("call'2",), False),
    ("- argv from Lua (luaArgsToServerArgv, freeLuaServerArgv)",
     ("luaArgsToServerArgv", "freeLuaServerArgv"), False),
    ("- reply to Lua (redisProtocolToLuaType_*)",
     ("redisProtocolToLuaType_Array.lto_priv.0", "redisProtocolToLuaType_Int.lto_priv.0",
      "redisProtocolToLuaType_BulkString.lto_priv.0", "redisProtocolToLuaType_Null.lto_priv.0"),
     False),
    ("- lookup, ACL, checks (scriptCall less call())", ("scriptCall",), False),
    ("Lua: the interpreter (luaV_execute's own)", ("luaV_execute",), True),
    ("Lua: string patterns (string.find, string.match)", ("str_find_aux",), False),
    ("Lua: concatenation (luaV_concat)", ("luaV_concat",), False),
    ("Lua: strings made (luaS_newlstr: concat, replies, captures)", ("luaS_newlstr",), False),
    ("Lua: tables made (luaH_new, newkey, luaH_resize)", ("luaH_new", "newkey", "luaH_resize"),
     False),
    ("Lua: garbage collector steps (luaC_step)", ("luaC_step",), False),
    ("Lua: function calls (luaD_precall own)", ("luaD_precall",), True),
    ("the reply of the FCALL (luaReplyToServerReply)", ("luaReplyToServerReply",), False),
]  # fmt: skip

LINE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+(\S.*?)(?: \[[^\]]*\])?\s*$")


def counts(path: str, inclusive: bool) -> dict[str, int]:
    """function name (without its file) -> instructions, from callgrind_annotate."""
    out = subprocess.run(
        ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
         "--threshold=100", path],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    found: dict[str, int] = {}
    for line in out.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        name = m.group(2)
        name = name if name == "PROGRAM TOTALS" else name.rsplit(":", 1)[-1]
        found[name] = found.get(name, 0) + int(m.group(1).replace(",", ""))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dumps", nargs="+", help="callgrind dumps (server_cost --keep-dumps)")
    parser.add_argument("--n", type=int, required=True, help="jobs in each dump's phase")
    args = parser.parse_args()
    incl = [counts(p, True) for p in args.dumps]
    excl = [counts(p, False) for p in args.dumps]
    print("| instructions per job | " + " | ".join(args.dumps) + " |")
    print("|---|" + "---:|" * len(args.dumps))
    for label, names, own in ROWS:
        cells = []
        for i, e in zip(incl, excl, strict=True):
            table = e if own else i
            total = sum(table.get(n, 0) for n in names)
            if label.startswith("- lookup"):
                total -= i.get("call'2", 0)
            cells.append(f"{total / args.n / 1000:,.1f}k")
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
