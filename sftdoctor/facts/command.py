"""`sftdoctor facts`: every fact of this machine and of the given configs, as the JSON snapshot `check --facts`
replays."""

from __future__ import annotations

import json

from sftdoctor.facts import Facts, Inputs


def main(inputs: Inputs) -> int:
    print(json.dumps(Facts(inputs).snapshot(), indent=2, default=str))
    return 0
