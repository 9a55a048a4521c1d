#!/usr/bin/env python3
"""check_pickle_writer.py TEST_PICKLE_WRITER — the document test_pickle_writer writes, loaded by
Python's own pickle (classes refused): the same values, and only the opcodes PyTorch's viewer
reads (check_snapshot.check_opcodes)."""
import os
import pickle
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_snapshot  # noqa: E402

INTS = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**47 + 5, 2**55 - 1, 2**55, 2**63 - 1, -1, -128,
        -129, -32768, -32769, -2**31, -2**31 - 1, -2**40, -2**63]
FFFD = "\ufffd"


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "doc.pickle")
        r = subprocess.run([sys.argv[1], path], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            return 1
        data = open(path, "rb").read()
    try:
        check_snapshot.check_opcodes(data)
    except check_snapshot.Failure as f:
        print("FAIL:", f)
        return 1
    doc = check_snapshot.PlainData(__import__("io").BytesIO(data)).load()
    want = {
        "ints": INTS,
        "strings": ["", "abc", "caf\u00e9", "a" + FFFD + "b", FFFD * 3, "\U0001F600", FFFD, "x" * 300],
        "misc": [1.5, -1e300, True, False, None, (7, "seven")],
        "big": list(range(2500)),
        "bigdict": {"k%d" % i: -i for i in range(2500)},
    }
    ok = True
    for k, v in want.items():
        if doc.get(k) != v:
            print("FAIL: %s: got %r" % (k, doc.get(k))[:300])
            ok = False
    shared = doc["shared"]
    if len(shared) != 601 or any(shared[i] is not shared[0] for i in range(1, 601, 2)) or shared[0] != {"name": "frame"}:
        print("FAIL: memoized values are not shared")
        ok = False
    keyed = doc["keyed"]
    if keyed != [[42], [42], [42], "frame"] or keyed[0] is not keyed[2]:
        print("FAIL: keyed memo: %r" % (keyed,))
        ok = False
    print("check_pickle_writer: %s" % ("all passed" if ok else "failed"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
