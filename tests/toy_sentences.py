"""Tiny labelled sentences for text tests: a polar word among filler words, so a small model can learn them."""

from __future__ import annotations

POSITIVE = "good great lovely fine happy superb nice".split()
NEGATIVE = "bad awful poor sad terrible ugly grim".split()
FILLER = "the movie was a film plot actor scene story it really quite".split()


def toy_sentence(i: int, positive: bool, word_step: int = 1) -> str:
    """Sentence ``i``: 1-5 filler words, the polar word ``i // word_step`` of its list, one more filler word."""
    words = POSITIVE if positive else NEGATIVE
    filler = " ".join(FILLER[(i * k) % len(FILLER)] for k in range(1, 2 + i % 5))
    return f"{filler} {words[(i // word_step) % len(words)]} {FILLER[i % len(FILLER)]}"
