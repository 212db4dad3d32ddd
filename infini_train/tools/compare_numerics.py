"""Compare two numerics-checker files and print the first entry where they diverge.

    python -m infini_train.tools.compare_numerics A.jsonl B.jsonl [--rtol R] [--atol A] [--skip-missing]
    python -m infini_train.tools.compare_numerics runs/a runs/b      # run directories: rank files pairwise
    python -m infini_train.tools.compare_numerics runs/fp32 runs/bf16 --ignore-dtype --rtol 2e-2   # across dtypes

Entries are matched by (step, phase, name, occurrence): the k-th entry of a name in a step and phase of A with
the k-th in B. Walking A in order, the first entry that diverges is reported with both sides' values: a
different shape or dtype, different nan/inf counts, a statistic (min, max, mean, absmax) off by more than
``atol + rtol * scale`` where scale is the larger absmax of the two (the tensor's magnitude, so a mean near zero
is not judged relative to itself), or (with rtol = atol = 0, the default) a different content hash; then an
entry found in only one file (``--skip-missing``: compare only the entries both have, e.g. a level-2 file against
a level-1 one). ``--ignore-dtype`` compares values across dtypes (an fp32 run against a bf16-mixed one): a dtype
difference alone is no divergence, the statistics are held to the tolerances and the hash is not compared where
the dtypes differ; the report shows both dtypes and counts the entries compared across dtypes. Exit status: 0 when
none diverge, 1 when one does, 2 on bad input.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

STATS = ("min", "max", "mean", "absmax")
REQUIRED = ("step", "phase", "name", "shape", "dtype", *STATS, "nan", "inf", "hash")


class BadInput(ValueError):
    """A path or file the tool cannot compare: the message says which, what was expected, and a hint."""


def load_entries(path):
    """The entries of one JSONL file, each with its line number under "_line"."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as exc:
        raise BadInput(f"{path}: expected a numerics-checker JSONL file, got {exc.strerror or exc}\n"
                       "HINT: run with numerics.level=1 (files in out_dir/numerics/rank<R>.jsonl)") from None
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{path}:{number}: expected a JSON object per line, got invalid JSON ({exc.msg})\n"
                           "HINT: is this a numerics-checker file (out_dir/numerics/rank<R>.jsonl)?") from None
        missing = [k for k in REQUIRED if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise BadInput(f"{path}:{number}: expected an entry with the keys {', '.join(REQUIRED)}, got one "
                           f"without {', '.join(missing)}\nHINT: is this a numerics-checker file?")
        entry["_line"] = number
        entries.append(entry)
    return entries


def keyed(entries):
    """{(step, phase, name, occurrence): entry}, in file order."""
    seen, out = {}, {}
    for e in entries:
        base = (e["step"], e["phase"], e["name"])
        k = seen.get(base, 0)
        seen[base] = k + 1
        out[(*base, k)] = e
    return out


def differences(a, b, rtol, atol, ignore_dtype=False):
    """[(field, value in A, value in B)] of the fields where entry ``a`` diverges from ``b``."""
    fields = ("shape", "nan", "inf") if ignore_dtype else ("shape", "dtype", "nan", "inf")
    diffs = [(f, a[f], b[f]) for f in fields if a[f] != b[f]]
    if diffs:
        return diffs
    scale = max(abs(a["absmax"] or 0.0), abs(b["absmax"] or 0.0))
    for f in STATS:
        va, vb = a[f], b[f]
        if (va is None) != (vb is None) or (va is not None and abs(va - vb) > atol + rtol * scale):
            diffs.append((f, va, vb))
    if not diffs and rtol == 0 and atol == 0 and a["dtype"] == b["dtype"] and a["hash"] != b["hash"]:
        diffs.append(("hash", a["hash"], b["hash"]))
    return diffs


def first_divergence(entries_a, entries_b, rtol=0.0, atol=0.0, skip_missing=False, ignore_dtype=False):
    """(report lines or None, number of entries that agree, {(dtype A, dtype B): how many of them across those})."""
    by_key_b = keyed(entries_b)
    keys_a = keyed(entries_a)
    compared, across = 0, {}
    for key, a in keys_a.items():
        b = by_key_b.get(key)
        if b is None:
            if skip_missing:
                continue
            return _missing(key, a, "A", "B"), compared, across
        diffs = differences(a, b, rtol, atol, ignore_dtype)
        if diffs:
            return _report(key, a, b, diffs, rtol, atol), compared, across
        compared += 1
        if a["dtype"] != b["dtype"]:
            across[a["dtype"], b["dtype"]] = across.get((a["dtype"], b["dtype"]), 0) + 1
    if not skip_missing:
        for key, b in by_key_b.items():
            if key not in keys_a:
                return _missing(key, b, "B", "A"), compared, across
    return None, compared, across


def _title(key):
    step, phase, name, k = key
    return f"step {step}, {phase}, {name}" + (f" (occurrence {k + 1})" if k else "")


def _missing(key, entry, where, other):
    return [f"first divergence: {_title(key)} (line {entry['_line']} of {where}) exists only in {where}",
            f"  HINT: {other} has no such entry; compare files of the same level and steps, or pass --skip-missing"]


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.9g}"
    return json.dumps(value)


def _report(key, a, b, diffs, rtol, atol):
    bad = {f for f, _, _ in diffs}
    scale = max(abs(a["absmax"] or 0.0), abs(b["absmax"] or 0.0))
    lines = [f"first divergence: {_title(key)} (line {a['_line']} of A, line {b['_line']} of B); "
             f"diverged: {', '.join(f for f, _, _ in diffs)}",
             f"  {'field':8} {'A':>24} {'B':>24} {'|A-B|':>12} {'allowed':>12}"]
    for f in ("shape", "dtype", *STATS, "nan", "inf", "hash"):
        va, vb = a[f], b[f]
        gap = allowed = ""
        if f in STATS and va is not None and vb is not None:
            gap, allowed = f"{abs(va - vb):.3g}", f"{atol + rtol * scale:.3g}"
        mark = "*" if f in bad else " "
        lines.append(f"{mark} {f:8} {_fmt(va):>24} {_fmt(vb):>24} {gap:>12} {allowed:>12}")
    if "dtype" in bad:
        lines.append(f"  HINT: the runs hold this tensor in {a['dtype']} and {b['dtype']}: pass --ignore-dtype (with a "
                     "tolerance such as --rtol 2e-2) to compare their values")
    return lines


def rank_files(path):
    """{file name: path} of the rank files of a run directory (out_dir, or its numerics/ folder); {None: path}
    for a file."""
    if os.path.isfile(path):
        return {None: path}
    if not os.path.isdir(path):
        raise BadInput(f"{path}: expected a numerics-checker JSONL file or a run directory, got a path that does "
                       "not exist\nHINT: the run writes out_dir/numerics/rank<R>.jsonl with numerics.level=1")
    folder = os.path.join(path, "numerics") if os.path.isdir(os.path.join(path, "numerics")) else path
    files = {os.path.basename(p): p for p in sorted(glob.glob(os.path.join(folder, "rank*.jsonl")))}
    if not files:
        raise BadInput(f"{path}: expected rank<R>.jsonl files in {folder}, got none\nHINT: was the run started "
                       "with numerics.level=1 or 2?")
    return files


def compare_paths(path_a, path_b, rtol=0.0, atol=0.0, skip_missing=False, out=None, ignore_dtype=False):
    """Compare two files or two run directories; prints the result (to ``out``, default stdout) and returns the
    exit status (0 or 1)."""
    out = out or sys.stdout
    files_a, files_b = rank_files(path_a), rank_files(path_b)
    if (None in files_a) != (None in files_b):
        raise BadInput(f"expected two files or two run directories, got {path_a!r} and {path_b!r}\nHINT: name a "
                       "rank file on both sides (out_dir/numerics/rank0.jsonl) or both run directories")
    if set(files_a) != set(files_b):
        raise BadInput(f"expected the same rank files on both sides, got {sorted(files_a)} in {path_a} and "
                       f"{sorted(files_b)} in {path_b}\nHINT: compare runs with the same number of ranks, or name "
                       "two rank files")
    status = 0
    for name in sorted(files_a, key=lambda n: (n is None, n)):
        report, compared, across = first_divergence(load_entries(files_a[name]), load_entries(files_b[name]), rtol,
                                                    atol, skip_missing, ignore_dtype)
        prefix = f"{name}: " if name is not None else ""
        dtypes = "".join(f"; {n} of them {da} in A, {db} in B" for (da, db), n in across.items())
        if report is None:
            print(f"{prefix}no divergence: {compared} entries agree (rtol {rtol:g}, atol {atol:g}{dtypes})", file=out)
        else:
            status = 1
            print(f"{prefix}{report[0]}", file=out)
            print("\n".join(report[1:]), file=out)
            print(f"  ({compared} entries before it agree; rtol {rtol:g}, atol {atol:g}{dtypes})", file=out)
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m infini_train.tools.compare_numerics",
                                     description="Print the first entry where two numerics-checker files (or the "
                                                 "rank files of two run directories) diverge.")
    parser.add_argument("a", help="JSONL file or run directory (A)")
    parser.add_argument("b", help="JSONL file or run directory (B)")
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance, times the larger absmax")
    parser.add_argument("--atol", type=float, default=0.0, help="absolute tolerance")
    parser.add_argument("--skip-missing", action="store_true", help="compare only entries present in both")
    parser.add_argument("--ignore-dtype", action="store_true",
                        help="compare values across dtypes (e.g. an fp32 run with a bf16-mixed one)")
    args = parser.parse_args(argv)
    try:
        if args.rtol < 0 or args.atol < 0:
            raise BadInput(f"--rtol/--atol: expected numbers >= 0, got {args.rtol:g} and {args.atol:g}\n"
                           "HINT: 1e-4 is a usual rtol between frameworks in float32")
        return compare_paths(args.a, args.b, args.rtol, args.atol, args.skip_missing, ignore_dtype=args.ignore_dtype)
    except BadInput as exc:
        print(f"compare_numerics: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
