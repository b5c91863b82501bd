#!/usr/bin/env python3
"""Prints what a test run leaves to read: its slowest tests (from nextest's JUnit report),
the seed of every seeded test it ran (the files `seed` under target/test-logs/<test>/) and
where the logs of failed tests are.

usage: scripts/test-report.py JUNIT_XML [N]
"""
import pathlib
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    report = pathlib.Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    root = pathlib.Path(__file__).resolve().parent.parent
    if not report.exists():
        print(f"test report: no {report} (did the build fail?)")
        return 0
    tests = []
    failed = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '')} {case.get('name', '')}".strip()
        tests.append((float(case.get("time", "0")), name))
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
    tests.sort(reverse=True)
    total = sum(t for t, _ in tests)
    print(f"\n{len(tests)} tests, {total:.0f} s of test time; the {min(count, len(tests))} slowest:")
    for secs, name in tests[:count]:
        print(f"  {secs:8.1f} s  {name}")
    seeds = sorted((root / "target" / "test-logs").glob("*/seed"))
    if seeds:
        print("\nseeds of this run (each line replays its test):")
        for path in seeds:
            print(f"  {path.parent.name}: {path.read_text().strip()}")
    if failed:
        print(f"\n{len(failed)} failed; their logs are under target/test-logs/<test>/, "
              f"their output in {report}:")
        for name in failed:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
