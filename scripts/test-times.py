"""Print the time of each test binary and the slowest tests from nextest's JUnit report.

    python3 scripts/test-times.py target/nextest/PROFILE/junit.xml [COUNT]

Run by scripts/test.sh at the end of every run. A binary's time is the sum of its tests' times
(they run in parallel with other binaries' tests, so the sums add up to more than the wall time).
"""

import sys
import xml.etree.ElementTree as ElementTree


def main():
    path = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    root = ElementTree.parse(path).getroot()
    binaries = []
    tests = []
    for suite in root.iter("testsuite"):
        cases = list(suite.iter("testcase"))
        seconds = sum(float(case.get("time", 0)) for case in cases)
        binaries.append((seconds, suite.get("name", "?"), len(cases)))
        for case in cases:
            failed = case.find("failure") is not None or case.find("error") is not None
            tests.append((float(case.get("time", 0)), suite.get("name", "?"), case.get("name", "?"), failed))
    binaries.sort(reverse=True)
    tests.sort(reverse=True)
    print(f"  test binaries by time (sum of their tests' seconds; {len(tests)} tests):")
    for seconds, name, cases in binaries:
        print(f"    {seconds:7.1f} s  {name} ({cases} tests)")
    print(f"  the {min(count, len(tests))} slowest tests:")
    for seconds, suite, name, failed in tests[:count]:
        print(f"    {seconds:7.1f} s  {suite} {name}{'  FAILED' if failed else ''}")


if __name__ == "__main__":
    main()
