"""The offline judge: deterministic rules plus embeddings, no model, no network.

Extraction reads the user's statements through :mod:`memory_pipelines.judge.statements`,
duplicates are judged on content words and embeddings, consolidation merges clauses
newer-wins and keeps every entity, and contradictions are entity-attribute-value
conflicts (:mod:`memory_pipelines.judge.clauses`) resolved by the authority order.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Literal

import numpy as np

from memory_pipelines.embeddings.protocol import Embedder
from memory_pipelines.errors import JudgeError, ValidationError
from memory_pipelines.judge.clauses import (
    _conflict_keys,
    _text_conflict,
)
from memory_pipelines.judge.decisions import (
    DUPLICATE_SIMILARITY,
    RATING_CONTEXTS,
    CandidateExample,
    CandidateNote,
    ConsolidationDecision,
    ContradictionDecision,
    ConversationMessage,
    DedupeDecision,
    _pair_precheck,
    authority_order,
    newer_of,
)
from memory_pipelines.judge.lexicon import (
    _bag,
    _information_diff,
    _lexical_similarity,
)
from memory_pipelines.judge.life import agree, match_life, resolve_dates
from memory_pipelines.judge.rules import (
    _CORRECTION,
    _EPHEMERAL,
    _FAILURE_ERROR,
    _FAILURE_LESSONS,
    _HEDGE_WORDS,
    _HEDGES,
    _PII,
    _QUESTION_TAIL,
    _SENSITIVE,
    _SMALL_TALK,
    _SOFT_WORDS,
    _SPECULATION,
    _STANDING,
    _WEATHER,
    reads_as_instruction,
)
from memory_pipelines.judge.selector import (
    RULE_SELECTED,
    TurnSelector,
    rewrite,
    selector_for,
    withheld,
)
from memory_pipelines.judge.statements import (
    _clip,
    _Draft,
    _expand_keep_case,
    _finish,
    _match_statement,
    _parts,
    _replace_value,
    _strip_leads,
)
from memory_pipelines.judge.synthesis import synthesize
from memory_pipelines.notes import Example, Note
from memory_pipelines.text import normalize_text


class _Drafts(list[_Draft]):
    """The drafts of one extraction, in order, indexed by :func:`_conflict_keys`: a new
    draft is compared only with the distinct texts that share a key with it (each once),
    so a message of many statements costs about linear time, not one comparison per pair
    of drafts."""

    def __init__(self) -> None:
        super().__init__()
        # key -> texts held under it (may keep texts already dropped: they are re-checked)
        self._by_key: dict[tuple[object, ...], set[str]] = {}

    def track(self, content: str) -> None:
        """Index ``content`` (a draft's text, new or changed in place)."""
        for key in _conflict_keys(content):
            self._by_key.setdefault(key, set()).add(content)

    def add(self, d: _Draft) -> None:
        """Append ``d`` after dropping every earlier draft whose text conflicts with it."""
        near: set[str] = set()
        for key in _conflict_keys(d.content):
            near |= self._by_key.get(key, set())
        doomed = {c for c in near if _text_conflict(c, d.content) is not None}
        if doomed:
            self[:] = [x for x in self if x.content not in doomed]
            for c in doomed:
                for key in _conflict_keys(c):
                    self._by_key[key].discard(c)
        self.append(d)
        self.track(d.content)


class OfflineJudge:
    """Deterministic judge: rules plus (optionally) embeddings, no model, no network.

    With ``embedder`` None it falls back to a lexical cosine over content words. Every
    decision is a pure function of its inputs (and the embedder's vectors).
    """

    name = "offline"

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        cache_size: int = 4096,
        life_rules: Collection[str] | None = None,
        selector: TurnSelector | None | Literal["auto"] = "auto",
    ) -> None:
        """Use ``embedder`` (any :class:`Embedder`) for similarities; None: lexical only.
        ``life_rules``: the life-fact families to apply (None: all of
        :data:`~memory_pipelines.judge.life.LIFE_FAMILIES`). ``selector``: the learned
        turn selector (:mod:`~memory_pipelines.judge.selector`); "auto" uses the shipped
        one when ``embedder`` is the one it was fitted with, None the rules alone."""
        self.embedder = embedder
        self.life_rules = None if life_rules is None else frozenset(life_rules)
        self.selector = selector_for(embedder) if selector == "auto" else selector
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = int(cache_size)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ similarity

    def _vectors(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of ``texts`` (embedded once per distinct text, LRU-cached)."""
        assert self.embedder is not None
        with self._lock:
            found = {t: self._cache[t] for t in dict.fromkeys(texts) if t in self._cache}
        todo = [t for t in dict.fromkeys(texts) if t not in found]
        if todo:
            try:
                vecs = np.asarray(self.embedder.embed(list(todo)), dtype=np.float32)
            except Exception as e:
                raise JudgeError(f"offline judge: embedding failed: {e}") from e
            if vecs.ndim != 2 or vecs.shape[0] != len(todo):
                raise JudgeError(
                    f"offline judge: embedder returned shape {vecs.shape} for {len(todo)} texts"
                )
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
            found.update(zip(todo, vecs, strict=True))
        with self._lock:
            for t, v in found.items():
                self._cache[t] = v
                self._cache.move_to_end(t)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return np.stack([found[t] for t in texts])

    def similarity(self, text: str, others: Sequence[str]) -> list[float]:
        """Cosine similarity of ``text`` to each of ``others`` (embedder, else lexical)."""
        if not others:
            return []
        if self.embedder is None:
            return [_lexical_similarity(text, o) for o in others]
        vecs = self._vectors([text, *others])
        return [float(x) for x in vecs[1:] @ vecs[0]]

    def _duplicate_of(self, candidate: str, notes: Sequence[Note]) -> tuple[Note, str] | None:
        """The note that ``candidate`` duplicates (or is a strict subset of), with the reason."""
        if not notes:
            return None
        norm = normalize_text(candidate)
        seq = _bag(candidate)
        for n in notes:
            if normalize_text(n.note) == norm:
                return n, f"identical to note {n.id}"
        for n in notes:
            other = _bag(n.note)
            if seq.sequence and seq.sequence == other.sequence and seq.negated == other.negated:
                return n, f"same content words as note {n.id}"
        sims = self.similarity(candidate, [n.note for n in notes])
        for n, s in sorted(zip(notes, sims, strict=True), key=lambda x: -x[1]):
            if s < DUPLICATE_SIMILARITY:
                break
            if _information_diff(candidate, n.note) is None:
                return n, f"restates note {n.id} (similarity {s:.2f}) without new information"
        return None

    # ------------------------------------------------------------------ extraction

    def extract_notes(
        self,
        messages: Sequence[ConversationMessage],
        existing: Sequence[Note],
        *,
        rating_context: str,
    ) -> list[CandidateNote]:
        """Durable statements of the user, rewritten as third-person notes.

        Reads user messages and rating comments (the user's words on any message); skips
        small talk, questions, one-off requests, speculation, PII and sensitive facts, and
        whole messages that try to steer the assistant ("ignore previous instructions").
        Later statements and corrections replace earlier conflicting ones. A candidate that
        duplicates an existing note is dropped; one that gives an existing note's attribute a
        new value carries that note's id in ``merge_with_existing_ids``. For
        ``rating_context="failure"`` at most one Issue lesson is returned.
        """
        if rating_context not in RATING_CONTEXTS:
            raise ValidationError(
                f"rating_context must be one of {', '.join(RATING_CONTEXTS)}; got {rating_context!r}"
            )
        if rating_context == "failure":
            drafts = self._failure_lesson(messages)
        else:
            drafts = self._statements(messages, rated=rating_context in ("positive", "negative"))
        return self._against_existing(drafts, existing)

    def _statements(self, messages: Sequence[ConversationMessage], *, rated: bool) -> list[_Draft]:
        drafts = _Drafts()
        for msg in messages:
            sources: list[tuple[str, bool]] = []
            if msg.role.lower() == "user" and msg.text:
                sources.append((msg.text, False))
            if msg.rating_comment:
                sources.append((msg.rating_comment, True))
            for text, in_comment in sources:
                if reads_as_instruction(text):
                    continue  # the whole message is untrusted: nothing in it becomes a note
                for sentence in re.split(r"(?<=[.!?])\s+|\n+", _expand_keep_case(text)):
                    self._sentence(sentence, msg, drafts, rated=rated, in_comment=in_comment)
                if self.selector is not None and not in_comment:
                    self._selected(text, msg, drafts)
        return drafts

    def _selected(self, text: str, msg: ConversationMessage, drafts: _Drafts) -> None:
        """A user turn the learned selector chooses, rewritten by the rules, unless a
        statement rule already read it or it states something sensitive."""
        assert self.selector is not None
        if any(d.source_message_id == msg.message_id for d in drafts) or withheld(text):
            return
        if not self.selector.select([text], self._vectors([text]))[0]:
            return
        found = rewrite(text, msg.sent_at, self.life_rules)
        if found is not None:
            d = _Draft(found[0], "Context", "user", 80.0, msg.message_id, rule=found[1])
            drafts.add(d)

    def _sentence(
        self,
        sentence: str,
        msg: ConversationMessage,
        drafts: _Drafts,
        *,
        rated: bool,
        in_comment: bool,
    ) -> None:
        s = sentence.strip()
        if len(s) < 4 or _PII.search(s) or _SENSITIVE.search(s):
            return
        if s.endswith("?"):
            s = _QUESTION_TAIL.sub("", s).strip()
            if not s or s.endswith("?"):
                return  # a question without a stated preference
        s = _strip_leads(s)
        corrected = False
        if m := _CORRECTION.match(s):
            corrected, s = True, _strip_leads(s[m.end() :])
        standing = False
        if m := _STANDING.match(s):
            standing, s = True, s[m.end() :]
        for part in _parts(s):
            part = _strip_leads(part)
            if not part or _SMALL_TALK.match(part) or _WEATHER.search(part):
                continue
            if not in_comment and not corrected and not standing:
                dated = resolve_dates(part, msg.sent_at)
                if (_EPHEMERAL.search(part) and dated != part) or not (
                    _EPHEMERAL.search(part) or _SPECULATION.search(part)
                ):
                    if self._life(dated, msg, drafts, part=part, rated=rated):
                        continue
            if _EPHEMERAL.search(part) or _SPECULATION.search(part):
                continue
            hedged = False
            if m := _HEDGES.match(part):
                hedged, part = True, part[m.end() :]
            hedged = hedged or bool(_HEDGE_WORDS.search(part))
            soft = bool(_SOFT_WORDS.search(part))
            d = _match_statement(part, standing=standing, rated=rated, in_comment=in_comment)
            if d is None:
                if corrected and drafts:
                    replaced = _replace_value(drafts[-1].content, part)
                    if replaced is not None:
                        prev = drafts.pop()
                        prev.content, prev.corrected = _clip(replaced), True
                        prev.source_message_id = msg.message_id
                        drafts.append(prev)
                        drafts.track(prev.content)
                continue
            d.content = _clip(d.content)
            if len(d.content) < 10:
                continue
            if hedged:
                d.confidence = 72.0
            elif soft:
                d.confidence = min(d.confidence, 82.0)
            d.source_message_id = msg.message_id
            d.corrected = corrected
            # A later statement (or explicit correction) replaces earlier conflicting ones.
            drafts.add(d)

    def _life(
        self,
        text: str,
        msg: ConversationMessage,
        drafts: _Drafts,
        *,
        part: str,
        rated: bool,
    ) -> bool:
        """A durable first-person life fact (:mod:`~memory_pipelines.judge.life`) in ``text``
        (``part`` with its relative dates resolved): appended as a Context draft. False when
        the part is not one, or when a statement rule reads it (those come first)."""
        if _match_statement(part, standing=False, rated=rated, in_comment=False) is not None:
            return False
        found = match_life(text)
        if found is None or (self.life_rules is not None and found[0] not in self.life_rules):
            return False
        if self.selector is not None and found[0] not in RULE_SELECTED:
            return False  # the learned selector decides; the rule only rewrites
        family, subject, rest = found
        hedged = bool(_HEDGES.match(text) or _HEDGE_WORDS.search(text))
        content = _clip(agree(_finish(subject, rest, "user")))
        if len(content) < 16:
            return False
        d = _Draft(content, "Context", "user", 72.0 if hedged else 88.0, msg.message_id)
        d.rule = family
        drafts.add(d)
        return True

    def _failure_lesson(self, messages: Sequence[ConversationMessage]) -> list[_Draft]:
        for msg in messages:
            if msg.role.lower() != "system" or not msg.text:
                continue
            m = _FAILURE_ERROR.search(msg.text)
            error = m.group(1) if m else msg.text
            for pattern, label, lesson in _FAILURE_LESSONS:
                if pattern.search(error):
                    content = _clip(f"Runs of this agent can fail with {label}: {lesson}.")
                    return [
                        _Draft(content, "Issue", "global", 82.0, msg.message_id, rule="failure")
                    ]
        return []

    def _against_existing(
        self, drafts: list[_Draft], existing: Sequence[Note]
    ) -> list[CandidateNote]:
        out: list[CandidateNote] = []
        seen: set[str] = set()
        for d in drafts:
            key = normalize_text(d.content)
            if key in seen:
                continue
            seen.add(key)
            words = _bag(d.content).words
            related = [n for n in existing if words & _bag(n.note).words]
            if self._duplicate_of(d.content, related) is not None:
                continue
            merge = tuple(n.id for n in related if _text_conflict(d.content, n.note) is not None)
            out.append(
                CandidateNote(
                    content=d.content,
                    type=d.type,
                    scope_level=d.scope_level,
                    confidence=float(d.confidence),
                    merge_with_existing_ids=merge,
                    protection_tier_hint="Ephemeral" if d.type == "Issue" else None,
                    source_message_id=d.source_message_id,
                    rule=d.rule,
                )
            )
        return out

    def extract_examples(
        self, messages: Sequence[ConversationMessage], existing: Sequence[Example]
    ) -> list[CandidateExample]:
        """(user request -> assistant answer) pairs whose answer the user rated 8 or more.

        success_score = rating * 10 (capped at 100), confidence 80. Skipped: small talk,
        inputs under 10 characters, PII, injection attempts, and inputs whose normalised
        text equals an existing example's (or an earlier pair's) input.
        """
        seen = {normalize_text(e.example_input) for e in existing}
        out: list[CandidateExample] = []
        question: ConversationMessage | None = None
        for msg in messages:
            role = msg.role.lower()
            if role == "user":
                question = msg
                continue
            if role != "assistant" or question is None or msg.rating is None or msg.rating < 8:
                continue
            inp, ans = question.text.strip(), msg.text.strip()
            key = normalize_text(inp)
            question = None
            if len(key) < 10 or not ans or key in seen or _SMALL_TALK.match(inp):
                continue
            if _PII.search(inp) or _PII.search(ans) or reads_as_instruction(inp):
                continue
            seen.add(key)
            out.append(
                CandidateExample(
                    example_input=inp,
                    example_output=ans,
                    success_score=float(min(100, msg.rating * 10)),
                    confidence=80.0,
                    source_message_id=msg.message_id,
                )
            )
        return out

    # ------------------------------------------------------------------ dedupe

    def is_duplicate(self, candidate: str, matches: Sequence[Note]) -> DedupeDecision:
        """should_add False only for a true duplicate or strict subset of a match:
        normalised-equal text, the same content words in the same order, or cosine >= 0.92
        with no new number, no negation change and no new content word. Otherwise True."""
        if not matches:
            return DedupeDecision(True, "no similar notes")
        dup = self._duplicate_of(candidate, matches)
        if dup is not None:
            return DedupeDecision(False, f"duplicate: {dup[1]}")
        sims = self.similarity(candidate, [n.note for n in matches])
        best = max(range(len(matches)), key=lambda i: sims[i])
        diff = _information_diff(candidate, matches[best].note)
        detail = f"; vs note {matches[best].id}: {diff}" if diff else ""
        return DedupeDecision(
            True, f"adds or changes information (best similarity {sims[best]:.2f}{detail})"
        )

    # ------------------------------------------------------------------ consolidation

    def synthesize_cluster(self, notes: Sequence[Note], *, anchored: bool) -> ConsolidationDecision:
        """One note replacing a valid cluster, clauses merged newer-wins with every entity
        kept (see :func:`memory_pipelines.judge.synthesis.synthesize`)."""
        return synthesize(notes, anchored=anchored, similarity=self.similarity)

    # ------------------------------------------------------------------ contradictions

    def detect_contradiction(self, a: Note, b: Note) -> ContradictionDecision:
        """Rule-based entity-attribute-value check, resolved by the authority order.

        'negation' (one note denies the other), 'competing_relation' (same subject and
        predicate, a different value for the same attribute) or 'temporal_supersession'
        (either of those where the newer note has a time cue such as "now", "as of",
        "switched", "no longer"). Winner: newer by more than 7 days, else higher importance,
        else higher access count. When all tie: is_contradiction False with the detected
        type kept ("keep both: no authority"). Self-pairs, different agents and different
        scopes are never contradictions.
        """
        pre = _pair_precheck(a, b)
        if pre is not None:
            return pre
        conflict = _text_conflict(a.note, b.note)
        if conflict is None:
            return ContradictionDecision(
                False, reason="no conflicting entity-attribute values: both kept"
            )
        kind = conflict.kind
        newer = newer_of(a, b)
        newer_clause = conflict.first if newer > 0 else conflict.second if newer < 0 else None
        if newer_clause is not None and newer_clause.time_cue:
            kind = "temporal_supersession"
        triples = (conflict.first.triple(), conflict.second.triple())
        auth = authority_order(a, b)
        if auth is None:
            return ContradictionDecision(
                False,
                contradiction_type=kind,
                reason=f"{kind} detected but keep both: no authority (same age, importance and access count)",
                confidence=85.0,
                entity_triples=triples,
            )
        winner, loser, rule = auth
        return ContradictionDecision(
            True,
            contradiction_type=kind,
            keep_note_id=winner.id,
            revoke_note_id=loser.id,
            reason=f"{kind} rule: '{conflict.first.text}' vs '{conflict.second.text}'; note {winner.id} wins ({rule})",
            confidence=85.0,
            entity_triples=triples,
        )
