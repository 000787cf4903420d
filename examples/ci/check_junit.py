"""Read HEMRA's JUnit file as a CI system does: one testcase per trial, with its properties.

python examples/ci/check_junit.py junit.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def main(path: str) -> int:
    cases = list(ET.parse(path).getroot().iter("testcase"))
    outcomes: Counter[str] = Counter()
    for case in cases:
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcomes[properties.get("outcome", "?")] += 1
        print(
            f"{case.get('name'):45} {properties.get('outcome', '?'):14}"
            f" reward={properties.get('reward', '')} retries={properties.get('retries', '')}"
        )
    print(f"{len(cases)} trials: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
