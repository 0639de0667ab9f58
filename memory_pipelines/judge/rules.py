"""The offline judge's regex tables, and :func:`reads_as_instruction`.

What steers the assistant (injection and fake prompt markup), what is private (PII,
sensitive facts), what is never durable (small talk, weather, one-off, speculation,
hedges), how sentences split into statements, which verbs start a standing instruction,
and the failure lessons drawn from a run's error. Tables only: the rules that use them
live in :mod:`memory_pipelines.judge.statements` and :mod:`memory_pipelines.judge.offline`.
"""

from __future__ import annotations

import re
import unicodedata

_INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,40}?\b(?:previous|prior|above|earlier|"
    r"all|any|your|the|system|safety|these|those|my)\b.{0,30}?\b(?:instructions?|rules?|prompts?|"
    r"guidelines?|directives?|polic(?:y|ies)|messages?|context|constraints?|programming)\b"
    r"|\byou (?:must|should|will|shall|are going to) now\b|\byou are now\b"
    r"|^\s*\W{0,3}(?:system|assistant|developer|admin|root)\s*[:>\]]"
    r"|\b(?:system|developer) (?:prompt|message|instructions?)\b|\bjailbreak|\bdeveloper mode\b"
    r"|\bdo anything now\b|\bprompt injection\b|\bnew (?:instructions|rules)\b"
    r"|\b(?:act as|pretend (?:to be|you are|that you)|role-?play as)\b"
    r"|\byour (?:rules|instructions|guidelines|programming|restrictions|system prompt|training)\b"
    r"|\b(?:from now on|going forward),? you (?:are|will be|must|have|can)\b"
    r"|\b(?:reveal|print|show|leak|repeat)\b.{0,30}\b(?:prompt|instructions|secrets?|api keys?)\b"
    r"|<\s*/?\s*(?:system|instructions?|inst)\s*>|\[\s*/?\s*(?:system|inst)\s*\]"
    r"|\b(?:add|save|store|write|create|insert|inject|remember)\b.{0,20}\b(?:notes?|memor(?:y|ies))"
    r"\b.{0,10}\b(?:that|saying|stating)\b|\b(?:to|in|into) your memory\b"
    r"|\b(?:obey|comply with) (?:me|my commands|everything|all)\b"
    r"|\b(?:forget|ignore|disregard) (?:everything|all of (?:that|this|it)|what (?:i|you) (?:said|were told))\b"
    r"|\b(?:respond|reply|answer) only with\b|\bonly (?:respond|reply|answer) with\b"
    r"|\b(?:admin(?:istrator)?|root|superuser|elevated) (?:access|privileges|rights|permissions)\b",
    re.I | re.S,
)
#: Fake prompt markup and role prefixes at the start of any line ("</memory_policy>",
#: "<|im_start|>", "SYSTEM:", "assistant:"): text dressed up as part of the prompt.
_PROMPT_MARKUP = re.compile(
    r"<\s*/?\s*(?:memory[_ -]?policy|system|assistant|developer|instructions?|inst|im_start|"
    r"im_end)\b[^<>]{0,40}>"
    r"|<\|\s*(?:im_start|im_end|system|assistant|user|endoftext)\s*\|>"
    r"|^[^\w\n]{0,3}(?:system|assistant|developer|admin|root|tool)\s*[:>\]]",
    re.I | re.M,
)


def reads_as_instruction(text: str) -> bool:
    """True when ``text`` reads as an instruction aimed at the assistant.

    The one test of "steering" text, shared by extraction (such a message yields no
    note), the in-flight write path (``rejected-type``), hardening (revoked) and
    importance scoring (never auto-protected): "ignore previous instructions",
    "forget everything", "respond only with", persona or privilege claims, and fake
    prompt markup or role prefixes (``</memory_policy>``, ``SYSTEM:``) at a line start.
    """
    if not isinstance(text, str) or not text:
        return False
    folded = fold_for_matching(text)
    return _INJECTION.search(folded) is not None or _PROMPT_MARKUP.search(folded) is not None


#: Characters that render as nothing but would split a word for a regex: Unicode format
#: characters (zero-width space and joiners, bidi controls, tag characters, soft hyphen),
#: variation selectors and fillers that draw blank.
_BLANK_GLYPHS = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x2800, 0x3164, 0xFFA0]
    + list(range(0xFE00, 0xFE10))
    + list(range(0xE0100, 0xE01F0))
)


def fold_for_matching(text: str) -> str:
    """``text`` as the instruction check reads it: Unicode NFKC (full-width, mathematical
    and other compatibility letters become their plain forms), without invisible
    characters (format characters such as zero-width spaces, bidi controls and tag
    characters, variation selectors, combining marks left after composition), and with
    unpaired surrogates dropped. Used for matching only; the stored text is unchanged."""
    text = unicodedata.normalize("NFKC", text.encode("utf-8", "ignore").decode("utf-8"))
    kept = [
        ch
        for ch in text
        if ord(ch) not in _BLANK_GLYPHS and unicodedata.category(ch) not in ("Cf", "Mn", "Me")
    ]
    # a second pass: removing a joiner can put two halves of a compatibility form together
    return unicodedata.normalize("NFKC", "".join(kept))


_PII = re.compile(
    r"[\w.+-]+@[\w-]+\.[\w.-]+"
    r"|(?<![\w.])(?:\+?\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?)?\d{3,4}[ .-]\d{3,4}(?:[ .-]\d{2,4})?(?![\w.])"
    r"|\b(?:\d[ -]?){13,19}\b|\b\d{3}-\d{2}-\d{4}\b|\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}\b"
    r"|\b\d{1,5} (?:\w+ ){1,3}(?:street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|"
    r"court|ct|way|place|pl|terrace|square)\b"
    r"|\bmy (?:full |real |legal |first |last )?name\b|\bcall me\b|\bi am called\b"
    r"|\bmy (?:password|passcode|pin|api key|secret|token|ssn|social security|credit card|"
    r"debit card|card number|bank account|account number|iban|routing number|passport|"
    r"driver'?s licen[cs]e|date of birth|birthday|dob|home address|address|phone|cell|mobile|"
    r"email|e-mail|username|login)\b",
    re.I,
)
_SENSITIVE = re.compile(
    r"\b(?:christian|muslim|jewish|hindu|buddhist|atheist|catholic|religio\w*|gay|lesbian|"
    r"bisexual|transgender|queer|pregnan\w*|diabet\w*|cancer|hiv|depress\w*|anxiety|adhd|"
    r"autis\w*|disabilit\w*|illness|disease|diagnosed|therapist|medication|democrat|"
    r"republican|political party|criminal record|arrested|convicted|my (?:salary|income|debts?))\b",
    re.I,
)
_SMALL_TALK = re.compile(
    r"^(?:hi|hello|hey|yo|thanks|thank you|thx|ty|cheers|bye|goodbye|see you|ok|okay|sure|"
    r"yes|yeah|yep|no|nope|cool|nice|great|awesome|perfect|got it|sounds good|lol|haha|"
    r"how are you|how is it going|what is up|good (?:morning|afternoon|evening|night)|"
    r"nice to meet you|have a (?:nice|good|great) (?:day|one|weekend)|well done|great job|"
    r"you are welcome|no problem)\b[\s\W]*$",
    re.I,
)
_WEATHER = re.compile(
    r"\b(?:weather|raining|rainy|sunny|snowing|forecast|temperature outside)\b", re.I
)
_EPHEMERAL = re.compile(
    r"\b(?:this time|for now|right now|today|tonight|tomorrow|yesterday|at the moment|"
    r"for the moment|just this|for this|in this (?:case|instance)|this particular|"
    r"this (?:morning|afternoon|evening|week|month|session|conversation|chat|report|chart|graph|"
    r"plot|table|document|doc|file|email|message|query|slide|deck|presentation|one|task|project|"
    r"draft|version|answer|response|analysis|spreadsheet|dataset|code|script)|"
    r"the (?:above|previous|last|next) (?:chart|report|answer|response|one|table|message)|"
    r"next (?:week|month|time)|later on|in a minute)\b",
    re.I,
)
_SPECULATION = re.compile(
    r"\b(?:maybe|perhaps|possibly|i might|i may|might be|could be|not sure|unsure|i wonder|"
    r"wondering|someday|some day|one day|thinking (?:about|of)|considering|if i|i could)\b",
    re.I,
)
_HEDGES = re.compile(
    r"^(?:i think|i guess|i suppose|i believe|i feel like|it seems|i would say)\b[,\s]*", re.I
)
_HEDGE_WORDS = re.compile(r"\b(?:kind of|sort of|probably|somewhat|a bit|i think|i guess)\b", re.I)
_SOFT_WORDS = re.compile(r"\b(?:usually|mostly|often|sometimes|tend to|generally)\b", re.I)
_LEAD_FILLERS = re.compile(
    r"^(?:also|and|but|so|well|oh|btw|by the way|fyi|just so you know|for the record|"
    r"for context|for your information|please note|note that|remember that|keep in mind that|"
    r"(?:just )?a heads up|heads up|in general|generally speaking|as a rule|ok|okay|yes|yeah|"
    r"sure|great|thanks|thank you|hi|hello|hey|honestly|personally|to be honest|fwiw|"
    r"for what it is worth)\b[,:;!.\s-]*",
    re.I,
)
_STANDING = re.compile(
    r"^(?:from now on|going forward|in (?:the )?future|moving forward|for (?:all )?future "
    r"\w+|every time|each time|whenever you \w+)[,:]?\s*",
    re.I,
)
_CORRECTION = re.compile(
    r"^(?:(?:actually|correction|sorry|oops|wait|scratch that|let me correct (?:that|myself)|"
    r"no,|nope,)[,:;!.\s-]*)+(?:(?:i|what i) meant(?: to say)?[,:]?\s*|i mean[,:]?\s*)?"
    r"|^(?:(?:i|what i) meant(?: to say)?|i mean)[,:]?\s+",
    re.I,
)
_QUESTION_TAIL = re.compile(r",?\s*(?:can|could|would|will) you\b.*$", re.I)
_PART_SPLIT = re.compile(
    r"\s*;\s*|,?\s+(?:and|but|plus)\s+(?=(?:i|we|my|our|always|never|please|also|for|this|"
    r"today|do not)\b)|,\s+(?=(?:i|we|my|our|always|never|please|from now on|going forward)\b)",
    re.I,
)
_CONDITIONAL_LEAD = re.compile(r"^(?:if|when|whenever|unless|although|because|since|while)\b", re.I)
_TRAILING_POLITE = re.compile(r"[,\s]*(?:please|thanks|thank you|thx|ok|okay)?[\s.!,;:]*$", re.I)
_DEICTIC = re.compile(
    r"^(?:it|this|that|these|those|them|the (?:chart|report|answer|response|one|result|idea))\b",
    re.I,
)
_UNIVERSAL = re.compile(
    r"\b(?:passwords?|credentials?|secrets?|api keys?|plain ?text|gdpr|hipaa|pci|sox|wcag|"
    r"accessibility|legal(?:ly)?|laws?|regulations?|regulatory|compliance|compliant|"
    r"personal data|pii)\b",
    re.I,
)
_BIO_HAVE = re.compile(
    r"^(?:kids?|children|child|sons?|daughters?|dogs?|cats?|pets?|brothers?|sisters?|"
    r"siblings?|grandchildren|husband|wife|partner|years? of experience|phd\b|ph\.d\.|"
    r"(?:\w+ )?degree|master'?s|bachelor'?s|doctorate|team of|direct reports|employees)",
    re.I,
)
_TOO_ADJ = re.compile(
    r"^(?:(?:way|much|far|a bit|a little|just) )?too (long|short|verbose|wordy|brief|technical|"
    r"vague|detailed|formal|informal|complicated|complex|simple|slow|generic|repetitive|"
    r"casual|dense|shallow)\b",
    re.I,
)
#: Verbs of work conventions stated with a bare "we" ("we deploy on Fridays").
_TEAM_VERBS = (
    "use|follow|prefer|require|deploy|store|report|ship|build|host|avoid|name|format|track|"
    "publish|release|review|code|test|standardize|standardise|log|measure|bill|invoice|"
    "operate|sell|serve|rely|develop|maintain|submit|document|prioritize|prioritise|target|"
    "schedule|deliver|run|write"
)
#: Objects that make a "we ..." sentence social talk, not a convention.
_SOCIAL_OBJECT = re.compile(r"\b(?:each other|one another|ourselves|together|it|that|this)\b", re.I)
#: Verbs an assistant-directed standing instruction may start with ("always cite ...").
_IMPERATIVE_VERBS = frozenset(
    (
        "use include cite add answer reply respond write format show give send provide keep make "
        "put start end list summarize summarise explain ask check mention round convert sort "
        "label confirm avoid return present highlight translate spell call refer address display "
        "report output link attach quote name capitalize bold number split break limit be do "
        "assume recommend suggest share remind tell greet sign open close compare offer copy "
        "test run deploy push commit merge review document comment indent wrap print describe "
        "state clarify verify validate follow stick stay treat consider default structure "
        "organize organise group order separate prioritize prioritise begin finish conclude "
        "abbreviate shorten expand simplify apologize apologise guess speculate invent fabricate "
        "lie swear joke talk discuss email text ping contact schedule book cancel delete remove "
        "drop change modify edit rewrite overwrite skip omit leave exclude hide truncate align "
        "color plot graph chart visualize visualise export respect double-check proofread "
        "store log encrypt expose reveal post publish go speak reference source sum total "
        "calculate compute estimate measure express convert date time-stamp timestamp"
    ).split()
)
#: Objects of like/love/hate that point at something in the conversation, not a preference.
_REACTION_OBJECT = re.compile(
    r"^(?:it(?! when)|this|that|these|those|them|how|what|when|where|why|the way|seeing|hearing)\b"
    r"|\byour?s?\b",
    re.I,
)

_CHANGE_VERB = re.compile(
    r"^(?:has |have )?(?:recently |just |now )?(?:switched|moved|migrated|upgraded|changed)"
    r"(?: over)? to\b",
    re.I,
)


# --------------------------------------------------------------------------- failures

_FAILURE_LESSONS: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(p, re.I), label, lesson)
    for p, label, lesson in (
        (
            r"context length|context window|maximum context|too many tokens|token limit|"
            r"context_length_exceeded|prompt is too long",
            "a context-length error",
            "inputs can exceed the model's context window, so trim or chunk large inputs",
        ),
        (
            r"rate.?limit|too many requests|\b429\b|throttl",
            "a rate-limit error",
            "back off and retry later, and batch or space out requests",
        ),
        (
            r"quota|insufficient_quota|billing|credits? (?:exhausted|exceeded)|usage limit",
            "a quota error",
            "the provider quota can run out, so check remaining quota before large jobs",
        ),
        (
            r"time[d -]?out|timed out|deadline exceeded|took too long",
            "a timeout",
            "long-running steps can exceed their time limit, so keep calls small or allow more time",
        ),
        (
            r"permission denied|forbidden|\b403\b|unauthori[sz]ed|\b401\b|access denied|"
            r"not authori[sz]ed|insufficient (?:privileges|permissions|scope)|missing (?:scope|permission)",
            "a permission error",
            "check credentials and the required permissions before calling the resource",
        ),
        (
            r"not found|\b404\b|no such (?:file|table|column|directory|key|record)|does not exist|"
            r"unknown (?:table|column|entity|field|model)",
            "a not-found error",
            "verify that referenced records and resources exist before using them",
        ),
        (
            r"invalid (?:input|format|json|argument|parameter|date|value|request|syntax)|malformed|"
            r"parse error|could not parse|failed to parse|json ?decode|schema validation|"
            r"validation error|unexpected token|type ?error|value ?error",
            "an invalid-input error",
            "validate the input format before calling tools",
        ),
        (
            r"connection (?:refused|reset|error|aborted)|network (?:error|unreachable)|"
            r"service unavailable|\b50[234]\b|bad gateway|econnreset|dns",
            "a connection error",
            "the upstream service can be unavailable, so retry with backoff",
        ),
        (
            r"out of memory|\boom\b|memoryerror|cannot allocate",
            "an out-of-memory error",
            "process large inputs in smaller batches",
        ),
    )
)
_FAILURE_ERROR = re.compile(
    r"Error:\s*(.*?)(?:\s*Identify a generalizable lesson.*)?$", re.I | re.S
)
