"""The offline judge's learned turn selector: "is this user turn a durable fact about the
user?", a logistic regression over the shipped embedder's sentence vector and the turn's
length.

Its weights and decision threshold ship as ``selector.json`` beside this module, fitted on
the LoCoMo dev conversations (per-session observations of the first speaker: a turn is
positive when it is the evidence of one) with the strength and threshold chosen by
leave-one-conversation-out for precision; refit with ``memory-pipelines bench extraction
--data FILE --fit-selector PATH``. It applies only with the embedder it was fitted with
(``all-MiniLM-L6-v2``, 384-d, the default): :func:`selector_for` returns None for any
other, and the offline judge then selects turns with its rules alone.

When it applies, the rules no longer decide whether a turn about the user's life becomes a
note: the selector does, and the rules only rewrite a selected turn into a third-person
note (a life-fact rule when one reads it, else the turn's first-person sentences) and keep
out the turns that state sensitive facts or personal data. Assistant-directed instructions,
stated preferences and health constraints (diets, allergies, injuries) are still read by
their rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from memory_pipelines.embeddings.protocol import Embedder
from memory_pipelines.errors import ConfigError
from memory_pipelines.judge.life import _third, agree, match_life, resolve_dates
from memory_pipelines.judge.rules import _PII, _QUESTION_TAIL, _SENSITIVE, _SMALL_TALK
from memory_pipelines.judge.statements import _clip, _expand_keep_case, _finish, _strip_leads

#: the rule family of a note the selector chose and no life-fact rule rewrote
SELECTOR_RULE = "selector"
#: life-fact families that still select on their own beside the selector: stated diets,
#: allergies and injuries are constraints a user expects kept however they are phrased
RULE_SELECTED = frozenset({"health"})
_FILE = "selector.json"
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|we|our|us)\b", re.I)
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
_ADVERBS = {"really", "usually", "often", "regularly", "always", "still", "also", "just", "finally"}
#: past forms (and modals) that take no third-person -s
_PAST = set(
    "was were did had got went made took saw came found felt began left met bought thought "
    "told said gave ran won lost kept spent sent built wrote read knew grew drove flew "
    "will would can could should might must may".split()
)


def length_feature(texts: Sequence[str]) -> np.ndarray:
    """The length feature of each text: log(1 + words) / 4."""
    return np.log1p([len(t.split()) for t in texts]) / 4.0


def features(texts: Sequence[str], embedder: Embedder) -> np.ndarray:
    """The embedder's unit vector of each text and its length feature (texts x dim + 1)."""
    if not texts:
        return np.zeros((0, embedder.dim + 1))
    vecs = np.asarray(embedder.embed(list(texts)), dtype=np.float64)
    vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    return np.hstack([vecs, length_feature(texts)[:, None]])


@dataclass(frozen=True)
class TurnSelector:
    """Weights over :func:`features` (bias last) and the decision threshold."""

    weights: np.ndarray
    threshold: float
    model_id: str
    dim: int
    meta: dict[str, Any] | None = None

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """P(durable fact) of each row of :func:`features`."""
        z = np.asarray(x, dtype=np.float64) @ self.weights[:-1] + self.weights[-1]
        return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))

    def select(self, texts: Sequence[str], vectors: np.ndarray) -> list[bool]:
        """Whether each text (with its unit ``vectors``) is selected."""
        if not texts:
            return []
        x = np.hstack([np.asarray(vectors, dtype=np.float64), length_feature(texts)[:, None]])
        return [bool(p >= self.threshold) for p in self.probabilities(x)]

    def applies_to(self, embedder: Embedder | None) -> bool:
        return (
            embedder is not None
            and getattr(embedder, "model_id", None) == self.model_id
            and getattr(embedder, "dim", None) == self.dim
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "model_id": self.model_id,
                "dim": self.dim,
                "threshold": self.threshold,
                "weights": [round(float(w), 6) for w in self.weights],
                "meta": self.meta or {},
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> TurnSelector:
        try:
            data = json.loads(text)
            weights = np.asarray(data["weights"], dtype=np.float64)
            dim = int(data["dim"])
            if weights.shape != (dim + 2,):
                raise ValueError(f"{weights.shape[0]} weights for dim {dim}")
            return cls(
                weights, float(data["threshold"]), str(data["model_id"]), dim, data.get("meta")
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"turn selector: unreadable weights: {e}") from e


_SHIPPED: list[TurnSelector] = []


def shipped() -> TurnSelector:
    """The selector shipped with the package (read once)."""
    if not _SHIPPED:
        text = resources.files("memory_pipelines.judge").joinpath(_FILE).read_text("utf-8")
        _SHIPPED.append(TurnSelector.from_json(text))
    return _SHIPPED[0]


def load(path: Path | str) -> TurnSelector:
    return TurnSelector.from_json(Path(path).read_text("utf-8"))


def selector_for(embedder: Embedder | None) -> TurnSelector | None:
    """The shipped selector when ``embedder`` is the one it was fitted with, else None."""
    sel = shipped()
    return sel if sel.applies_to(embedder) else None


def withheld(text: str) -> bool:
    """True when the turn states personal data or a sensitive fact: never a note."""
    return bool(_PII.search(text) or _SENSITIVE.search(text))


def _third_person(sentence: str) -> str:
    """A first-person sentence as a note: "I adopted a puppy" -> "User adopted a puppy."."""
    text = agree(_finish("", sentence, "user"))
    if text.startswith("They "):
        rest = text[len("They ") :]
        for plural, single in (("are ", "is "), ("were ", "was ")):
            if rest.startswith(plural):
                return "User " + single + rest[len(plural) :]
        verb = next((w for w in rest.split() if w.lower() not in _ADVERBS), "").lower()
        present = verb.isalpha() and not verb.endswith(("ed", "s")) and verb not in _PAST
        return "User " + (_third(rest) if present else rest)
    if text.startswith("Their "):
        return "User's " + text[len("Their ") :]
    return "User: " + text[:1].lower() + text[1:] if text[:1].isupper() else "User: " + text


def rewrite(
    text: str, sent_at: datetime | None, families: Collection[str] | None = None
) -> tuple[str, str] | None:
    """A selected turn as (note text, rule family): the first of its sentences a life-fact
    rule (of ``families``; None: any) reads, else its first-person sentences (no questions,
    no small talk) in the third person; None when it has none."""
    kept: list[str] = []
    for raw in _SENTENCES.split(_expand_keep_case(text)):
        s = _strip_leads(raw.strip())
        if s.endswith("?"):
            s = _QUESTION_TAIL.sub("", s).strip()
            if not s or s.endswith("?"):
                continue
        if len(s) < 4 or _SMALL_TALK.match(s) or not _FIRST_PERSON.search(s):
            continue
        dated = resolve_dates(s, sent_at)
        found = match_life(dated)
        if found is not None and (families is None or found[0] in families):
            family, subject, rest = found
            content = _clip(agree(_finish(subject, rest, "user")))
            if len(content) >= 16:
                return content, family
        kept.append(dated.rstrip(" .!"))
    if not kept:
        return None
    content = _clip(" ".join(_third_person(s) for s in kept[:2]))
    return (content, SELECTOR_RULE) if len(content) >= 16 else None
