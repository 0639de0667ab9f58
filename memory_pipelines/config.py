"""Every settings dataclass of the memory system, with the reference defaults.

Model layer: the write guard, injection, the Memory Manager's cycle and each maintenance
phase read their thresholds from here; nothing here reads the store or the clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from memory_pipelines.errors import ConfigError
from memory_pipelines.limits import limits
from memory_pipelines.text import STEMMERS

#: note columns with a scalar (Bitmap) index: the maintenance compaction creates them, and
#: the background compaction once the table is large enough (``RowTable.scalar_columns``)
INDEXED_NOTE_COLUMNS: tuple[str, ...] = ("agent_id", "status", "user_id", "company_id")


@dataclass(frozen=True)
class TableTuning:
    """How a note or example table keeps itself fast under a trickle of writes: when it
    gets its indexes, and how its background compaction merges fragments and drops old
    versions. The defaults were measured at a fast trickle (``memory-pipelines bench
    trickle``); a test makes them small to see each rule act on a few rows."""

    #: rows from which a table gets a BTree index on ``id`` and its Bitmap indexes (below
    #: it a scan is as cheap)
    id_index_min_rows: int = 1_000
    #: the youngest version an automatic compaction may drop
    min_cleanup_age: timedelta = timedelta(seconds=5)
    #: the background compaction drops old versions at most this often (reading every
    #: kept manifest cost more than the merge itself at a fast trickle)
    cleanup_every_s: float = 2.5
    #: the tail compaction merges the newest fragments under this many rows (a
    #: fragment an index covers is never rewritten by it)
    tail_fragment_rows: int = 2_048
    #: ... and folds the rows outside the indexes into them once this many rows, and
    #: this share of the table, are outside
    index_lag_rows: int = 8_192
    index_lag_share: float = 0.05
    #: bytes of table metadata (manifests, file footers) each of a home's Lance caches
    #: keeps: LanceDB's (one per home) and pylance's (one per table); every commit adds
    #: its version's (4-19 KB), so this bounds what a long-lived writer keeps (the
    #: libraries' own default is 1 GiB each). A compacted 1M-note table reads as fast
    #: with 8 MiB as with 32 (a scope's first read 29 ms, after a restart 227 / 222 ms)
    metadata_cache_bytes: int = 8 * 2**20
    #: bytes of index pages (the id, scope and text indexes) each of those caches keeps
    #: (the libraries' own default is 6 GiB each; a 1M-note home's indexes take ~32 MB)
    index_cache_bytes: int = 128 * 2**20
    #: glibc only: allocations of at least this many bytes get their own mapping, returned
    #: to the system when freed, instead of a piece of a thread's heap arena; opening a
    #: store holds the process's threshold here (glibc's own starts at 128 KiB and rises
    #: with every large block freed, after which a long-lived writer's arenas fragment).
    #: 0 leaves glibc's own; a ``MALLOC_MMAP_THRESHOLD_`` set by the host always stands
    mmap_threshold_bytes: int = 2**20
    #: a scope's first read takes only the ranking columns (the rest of a note is read by
    #: row id once it is injected) from tables of at least this many rows: there the rows
    #: of a scope are spread over many files and reading thirty columns of each costs
    #: several times more; below it the whole rows are read, so a warm injection never
    #: reads the table (narrow reads made warm injects at 10k notes 2x slower)
    narrow_read_min_rows: int = 250_000

    def __post_init__(self) -> None:
        if min(self.id_index_min_rows, self.index_lag_rows, self.narrow_read_min_rows) < 0 or (
            self.tail_fragment_rows < 1
        ):
            raise ConfigError("table tuning row counts must be >= 0 (tail_fragment_rows >= 1)")
        if min(self.metadata_cache_bytes, self.index_cache_bytes, self.mmap_threshold_bytes) < 0:
            raise ConfigError("table tuning cache sizes and thresholds must be >= 0 bytes")
        if self.min_cleanup_age < timedelta(0) or self.cleanup_every_s < 0:
            raise ConfigError("table tuning ages and intervals must be >= 0")
        if not 0.0 <= self.index_lag_share <= 1.0:
            raise ConfigError("index_lag_share must be between 0 and 1")


@dataclass(frozen=True)
class WriteConfig:
    """Guard settings of the in-flight write path.

    ``near_dup_similarity`` is calibrated for the default embedder (all-MiniLM-L6-v2):
    light edits of a note (case, punctuation, "The user" vs "User", a trailing period)
    score 0.94-1.00, while corrections and changed values score up to about 0.91 (the
    reference's 0.85 was set for another model; see tests/writes/test_writes_calibration.py).
    Recalibrate it with that test's labelled pairs when you change the embedder.

    ``group_commit`` (on by default): concurrent ``svc.write`` callers of one service run
    together, with one embedding call and one commit per round, with the results they would
    get one after another (:mod:`memory_pipelines.writes.combine`); off, each call runs
    on its own.
    """

    max_writes_per_run: int = 5
    near_dup_similarity: float = 0.92
    default_ttl_days: int = 7
    max_note_length: int = field(default_factory=lambda: limits().max_note_chars)
    group_commit: bool = True

    def __post_init__(self) -> None:
        if self.max_writes_per_run < 0:
            raise ConfigError("max_writes_per_run must be >= 0")
        if not 0.0 < self.near_dup_similarity <= 1.0:
            raise ConfigError("near_dup_similarity must be in (0, 1]")
        if self.default_ttl_days <= 0:
            raise ConfigError("default_ttl_days must be > 0")
        if self.max_note_length <= 0:
            raise ConfigError("max_note_length must be > 0")


@dataclass(frozen=True)
class InjectConfig:
    """Retrieval settings of the injection path.

    ``min_similarity`` is the cosine floor for vector candidates, calibrated for MiniLM
    (unrelated sentences score about -0.07..0.1, paraphrases 0.6..0.9, LoCoMo evidence
    turns against their questions 0.24 at the 5th percentile); a full-text hit passes
    without it. ``vector_weight``/``text_weight`` weigh the normalised cosine and BM25
    scores; ``context_weight`` and ``neighbour_weight`` the conversation context (same
    source conversation, adjacent turn). The defaults were chosen on the LoCoMo dev split
    (``memory-pipelines bench locomo``: recall_any@5 0.69 against 0.59 for BM25 alone and
    0.45 for dense alone; 0.684 mean validation, leave-one-conversation-out). ``candidate_pool`` is how many candidates each search returns
    before fusion; ``max_fetch`` caps the over-fetch used when the multi-tenant
    post-filter drops candidates. ``include_memory_policy`` renders the policy block;
    ``record_attribution`` appends injection events and the audit step.

    The lexical side over cached rows and in time travel is BM25 in process
    (:mod:`memory_pipelines.injection.lexical`): ``lexical_stemmer`` names the stemmer of
    its terms (``none``, ``light``, ``strong``; :data:`memory_pipelines.text.STEMMERS`;
    ``strong`` was chosen on 4 of 5 tune folds of ``bench locomo --cv``, ``light`` on one);
    pseudo-relevance feedback adds the ``prf_terms`` heaviest terms of the ``prf_docs``
    best BM25 documents to the query, the heaviest with weight ``prf_weight`` (0: off).
    Scopes too large for the read cache use LanceDB's full-text index (neither applies).
    Evidence features (:mod:`memory_pipelines.injection.evidence`, chosen by
    ``bench locomo --cv``): ``fusion`` ``"score"`` (normalised scores) or ``"rrf"``
    (reciprocal ranks with constant ``rrf_k``); ``session_weight`` (the best match of the
    candidate's source conversation); ``speaker_weight`` / ``entity_weight`` (names in
    the input matched against the turn's ``"Speaker:"`` prefix / capitalised words);
    ``time_weight`` (months, years and relative phrases of the input matched against the
    note's ``created_at``, and "when" questions against turns that place things in time).
    The speaker and time weights are the values every leave-one-conversation-out fold
    chose; rank fusion, session evidence and entities did not raise the validation mean
    beside them, so they stay off. ``role_weight``: a question about what the assistant
    said ("what did you recommend") favours notes stored as ``"assistant: ..."`` turns, one
    in the first person ("my", "I") ``"user: ..."`` ones. ``time_window_weight``: notes
    created inside the span a relative expression of the input names ("three weeks ago",
    "last Saturday", "the past 2 weeks", "2023-05-08"), resolved against the clock.
    Both were chosen by nested ``bench locomo --cv`` on the chat view of the dev file
    (``--format chat``): ``role_weight`` 2 in four of five outer folds (1 in the other; 3
    falls off); no dev question has a relative expression, so the windows were weighed on
    ``--time-probe`` questions, whose phrases are exact by construction and favour every
    larger weight (2, the grid's top, was chosen on both formats): 1, the date cue's
    weight, takes most of that gain. Neither changes the LoCoMo format's figures beyond
    the probe (no ``user:``/``assistant:`` notes, no relative expressions).
    Coverage (:mod:`memory_pipelines.injection.diversity`): ``mmr_lambda`` below 1 re-picks
    the first k by maximal marginal relevance (fused score against word overlap with the
    notes already picked; 1: off); ``session_cap`` allows at most that many of the first k
    from one source conversation (0: no cap); ``update_similarity`` above 0 lets the newest
    of near-copies (that share of words) take the place of an older one picked (0: off).
    0.4 and no cap are what the inner folds of
    nested ``bench locomo --cv`` chose in every outer fold (grid 1, 0.85 ... 0.3; caps 1-3
    were never chosen); 0.3 falls off, so lower values are not safer.
    ``session_penalty`` above 0 takes that times the number of notes already picked from
    a candidate's source conversation off its MMR objective (a soft cap; 0: off).
    ``cover_parts`` fills the first k so each part of a question with several (``X or
    Y``, ``both X and Y``, before/after, several named things) gets its best note before
    any part gets a second (:mod:`memory_pipelines.injection.parts`; off by default).
    Long notes (lexical side over cached rows and in time travel): ``passage_words`` above
    0 also scores a note longer than ``passage_min_words`` terms (0: longer than one
    window) by its best window of that many terms (stride half a window), so a long turn
    holding the answer in one sentence is not buried by length normalisation (0: off).
    16 is what nested ``bench locomo --cv`` chose, on the chat format (grid 8-48, 4 of 5
    outer folds; with the role cue on since, its folds split between 0, 16 and 24) and on
    LoCoMo's short turns (grid 16-32, every fold). ``cover_parts`` was
    never chosen on either (it changes the first five for about 3% of the questions) and
    ``session_penalty`` only by 2 of 5 chat folds, lowering the outer mean: both stay off.
    ``learned_ranker`` reorders the fused candidates with the shipped logistic regression
    of :mod:`memory_pipelines.injection.learned` when the embedder is the one it was fitted
    with (the default MiniLM) and the input has a vector; its own ``mmr_lambda`` (chosen
    with it by nested cross-validation) then replaces ``mmr_lambda``. The weights above
    still shape the signals it reads.
    """

    min_similarity: float = 0.2
    example_min_similarity: float = 0.2
    vector_weight: float = 0.4
    text_weight: float = 0.6
    context_weight: float = 0.2
    neighbour_weight: float = 0.3
    fusion: str = "score"
    rrf_k: float = 60.0
    session_weight: float = 0.0
    speaker_weight: float = 0.5
    entity_weight: float = 0.0
    time_weight: float = 1.0
    role_weight: float = 2.0
    time_window_weight: float = 1.0
    candidate_pool: int = 50
    max_fetch: int = 5000
    include_memory_policy: bool = True
    record_attribution: bool = True
    reranker_timeout_s: float = 15.0
    lexical_stemmer: str = "strong"
    prf_docs: int = 10
    prf_terms: int = 10
    prf_weight: float = 0.0
    mmr_lambda: float = 0.4
    session_cap: int = 0
    update_similarity: float = 0.0
    session_penalty: float = 0.0
    cover_parts: bool = False
    passage_words: int = 16
    passage_min_words: int = 0
    learned_ranker: bool = True

    def __post_init__(self) -> None:
        if self.passage_words < 0 or self.passage_min_words < 0:
            raise ConfigError(
                "passage_words and passage_min_words must be 0 (off / one window) or more, "
                f"got {self.passage_words!r} and {self.passage_min_words!r}"
            )
        if self.session_penalty < 0.0:
            raise ConfigError(
                f"session_penalty must be 0 (off) or more, got {self.session_penalty!r}"
            )
        if not 0.0 <= self.update_similarity <= 1.0:
            raise ConfigError(
                f"update_similarity must be between 0 and 1, got {self.update_similarity!r}"
            )
        if not 0.0 <= self.mmr_lambda <= 1.0:
            raise ConfigError(f"mmr_lambda must be between 0 and 1, got {self.mmr_lambda!r}")
        if self.session_cap < 0:
            raise ConfigError(f"session_cap must be 0 (no cap) or more, got {self.session_cap!r}")
        if self.lexical_stemmer not in STEMMERS:
            raise ConfigError(
                f"lexical_stemmer must be one of {', '.join(STEMMERS)},"
                f" got {self.lexical_stemmer!r}"
            )


@dataclass(frozen=True)
class ManagerConfig:
    """Thresholds of the cycle phases (reference §4.1, §7)."""

    min_confidence: float = 80.0
    min_content_length: int = 10
    max_note_length: int = 2000
    max_notes_per_run: int = 1000
    max_conversations: int = 1000
    max_high_value_runs: int = 50
    max_failed_runs: int = 50
    high_value_share_count: int = 2
    high_value_artifact_count: int = 5
    max_failure_error_chars: int = 2000
    existing_notes_for_judge: int = 200
    note_dedupe_k: int = 10
    note_dedupe_similarity: float = 0.85
    example_min_success: float = 70.0
    example_min_confidence: float = 70.0
    example_dedupe_k: int = 5
    example_dedupe_similarity: float = 0.7
    existing_examples_for_judge: int = 50
    hardening_max_notes: int = 200
    hardening_similarity: float = 0.85
    fold_batch_size: int = 5000
    #: How far before the last watermark the activity query starts again, so a message
    #: committed while the previous extraction was running is not missed. The
    #: per-conversation cursor keeps the overlap from being mined twice.
    activity_overlap: timedelta = timedelta(minutes=5)
    #: A conversation (or failed run) whose judge calls keep failing is asked again each
    #: cycle, and holds the activity watermark before it, until it has failed this many
    #: times over at least ``judge_give_up_after`` (service clock); then it is given up:
    #: its cursor moves past it and an audit step names it. 0 asks again forever.
    judge_give_up_attempts: int = 3
    judge_give_up_after: timedelta = timedelta(days=1)
    #: The sensor starts a cycle once this many provisional notes are new since its cursor.
    provisional_backlog: int = 10
    #: One Memory Manager run at a time per home (:mod:`memory_pipelines.phases.lease`):
    #: the lease lives this many seconds past its last renewal (a run renews it every
    #: third of that; a crashed run's lease frees the home after it) ...
    lease_ttl_s: float = 60.0
    #: ... and a second run waits this long for it before giving up, changing nothing.
    lease_wait_s: float = 600.0

    def __post_init__(self) -> None:
        if self.judge_give_up_attempts < 0:
            raise ConfigError(
                "judge_give_up_attempts must be 0 (ask forever) or more, "
                f"got {self.judge_give_up_attempts!r}"
            )
        if self.judge_give_up_after < timedelta(0):
            raise ConfigError(
                f"judge_give_up_after must not be negative, got {self.judge_give_up_after!r}"
            )


@dataclass(frozen=True)
class ImportanceConfig:
    """Weights and thresholds of importance scoring (reference §4.1 defaults)."""

    recency_weight: float = 0.20
    llm_importance_weight: float = 0.25
    relevance_weight: float = 0.15
    uniqueness_weight: float = 0.15
    correction_weight: float = 0.10
    goal_alignment_weight: float = 0.10
    user_mark_weight: float = 0.05
    #: points added (capped at 10) when the correction signal fires
    correction_bonus_points: float = 1.5
    #: Standard notes at or above this score are promoted to Protected
    auto_promote_threshold: float = 8.0
    #: the uniqueness percentile promotion needs a cohort (and sample) at least this big
    outlier_promotion_min_cohort: int = 20
    outlier_percentile: float = 0.95
    #: recency = base ** hours since creation
    recency_base_per_hour: float = 0.995
    #: llmImportance when the comments mention "confidence" (reference heuristic)
    llm_importance_value: float = 0.7
    #: relevance: injections at which the frequency half saturates (log scale)
    relevance_saturation_count: int = 20
    #: relevance: the freshness half decays by this base per hour since the last injection
    relevance_recency_base_per_hour: float = 0.995


@dataclass(frozen=True)
class ConsolidationConfig:
    """Consolidation settings (reference §4.1 and §4.8 defaults)."""

    similarity_threshold: float = 0.60
    #: neighbours a seed takes (the reference's FindSimilarAgentNotes top 10)
    top_k: int = 10
    min_cluster_size: int = 3
    #: minimum cluster when the seed is Ephemeral
    ephemeral_min_cluster_size: int = 2
    max_cluster_size: int = 7
    #: at or above this generation a cluster is re-synthesised from its originals
    max_consolidation_count: int = 3
    max_source_resolution_depth: int = 10
    #: missing entities named in the verification marker
    verification_entity_limit: int = 10
    #: judged clusters are saved (new notes first, then revocations) in batches of at most
    #: this many, or after this many seconds of judging: a crash loses at most one batch
    #: of judge work, and a fast judge does not pay one table merge per few clusters
    batch_clusters: int = 2000
    batch_seconds: float = 60.0


@dataclass(frozen=True)
class ContradictionConfig:
    """Contradiction settings (reference §4.1 defaults)."""

    similarity_threshold: float = 0.70
    top_k: int = 5
    max_pairs_per_run: int = 50
    high_importance_threshold: float = 7.0
    #: judged pairs remembered (by content) so the per-run cap is not spent re-asking them
    judged_memory_size: int = 20000


@dataclass(frozen=True)
class DecayConfig:
    """Decay and TTL settings (reference §4.1 and §4.11 defaults)."""

    base_lambda: float = 0.16
    importance_dampening: float = 0.8
    access_boost_factor: float = 0.2
    access_retention_cap: float = 1.5
    protected_inactivity_days: float = 365.0
    ephemeral_decay_multiplier: float = 2.0
    archival_floor: float = 0.5
    #: a factor at or above this leaves the stored score unchanged
    save_factor_below: float = 0.99
    max_notes_per_run: int = 1000
    max_examples_per_run: int = 500
    #: examples decay only below this success score (0-100)
    example_success_threshold: float = 50.0
    #: success score assumed for an example that has none
    example_default_success: float = 25.0
    ttl_max_notes_per_run: int = 200
    ttl_max_examples_per_run: int = 200


@dataclass(frozen=True)
class PruningConfig:
    """Stale-reference pruning settings (reference §4.10)."""

    max_notes_per_run: int = 200


@dataclass(frozen=True)
class MaintenanceConfig:
    """Every maintenance constant (reference §4.1 defaults).

    ``frequency``: ``"disabled"``, ``"every-run"``, ``"hourly"``, ``"daily"`` or an int N
    (every N completed cycles), always measured since the last maintenance.
    ``note_count_trigger``: new Active auto-generated notes of one agent since the last
    maintenance that fire it early.
    """

    frequency: str | int = "daily"
    note_count_trigger: int = 100
    importance: ImportanceConfig = field(default_factory=ImportanceConfig)
    consolidation: ConsolidationConfig = field(default_factory=ConsolidationConfig)
    contradiction: ContradictionConfig = field(default_factory=ContradictionConfig)
    pruning: PruningConfig = field(default_factory=PruningConfig)
    decay: DecayConfig = field(default_factory=DecayConfig)
    #: table versions older than this are removed by compaction (never zero while other
    #: readers may hold an old version)
    cleanup_older_than: timedelta = timedelta(hours=1)
    #: columns that get a scalar (Bitmap) index so filtered searches stay fast at scale
    indexed_columns: tuple[str, ...] = INDEXED_NOTE_COLUMNS
