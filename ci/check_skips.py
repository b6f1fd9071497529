#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails (exit 1) when a ctest JUnit report lists a skipped test whose output does not say
"not applicable": on a GPU host, a C++ GPU test that skips for any other reason (a missing
capability, a wrong guard) is a failure, as ASYNCMR_REQUIRE_GPUS makes it for the Python suite.

    python ci/check_skips.py REPORT.xml
"""

import sys
import xml.etree.ElementTree as ET


def main(path: str) -> int:
    bad = []
    skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("status") != "skipped" and case.find("skipped") is None:
            continue
        skipped += 1
        text = " ".join((e.text or "") + " " + " ".join(e.attrib.values()) for e in case.iter())
        if "not applicable" not in text:
            bad.append(case.get("name"))
    print(f"{path}: {skipped} skipped, {len(bad)} of them not 'not applicable'")
    for name in bad:
        print(f"  skipped on a GPU host: {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
