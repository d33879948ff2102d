"""The flight-recorder dumps of the 2-rank gloo drills (tests/fixtures/flight_recorder), and the words that only
a dump from every rank may justify: what is said of a rank whose dump never came must not use them."""

import shutil
from pathlib import Path

FLIGHT_RECORDER = Path(__file__).parent / "fixtures" / "flight_recorder"
ALL_RANKS = (
    "every rank",
    "none completed",
    "collective itself is stuck",
    "collectives match",
    "no rank is inside a collective",
)


def claims_all(text: str) -> bool:
    """Whether `text` speaks for every rank."""
    return any(words in text for words in ALL_RANKS)


def only_rank_0(run_dir: Path) -> Path:
    """`run_dir`/flight-recorder holding rank 0's dump of the 2-rank hang drill alone, as if rank 1 froze before
    it could dump."""
    folder = run_dir / "flight-recorder"
    folder.mkdir()
    shutil.copy(FLIGHT_RECORDER / "gloo-hang-drill" / "rank-0", folder / "rank-0")
    return folder
