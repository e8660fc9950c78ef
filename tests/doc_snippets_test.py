#!/usr/bin/env python3
"""Every ```cpp (and ```python) block of a guide appears word for word in a source that the
tests compile (or run).

    doc_snippets_test.py GUIDE.md SOURCE.cc [SOURCE.cc ...]
"""
import re
import sys


def main() -> int:
    guide, sources = sys.argv[1], sys.argv[2:]
    text = "".join(open(s, encoding="utf-8").read() for s in sources)
    blocks = re.findall(r"```(?:cpp|python)\n(.*?)```", open(guide, encoding="utf-8").read(), re.S)
    if not blocks:
        print(f"FAIL: {guide} has no code blocks")
        return 1
    missing = [b for b in blocks if b not in text]
    for b in missing:
        print(f"FAIL: this block of {guide} is in none of {sources}:\n{b}")
    print(f"{len(blocks) - len(missing)} of {len(blocks)} code blocks of {guide} are tested code")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
