"""The memory proxy: memory for any OpenAI-compatible client.

``memory-pipelines proxy [--home H] --model MODEL [--host 127.0.0.1] [--port 8766]
[--passthrough] [--timeout S] [--max-body-bytes N] [--max-injected-tokens [AGENT=]N]``
serves an OpenAI-compatible API in front of any litellm model string (for ``openai/...``
models the usual ``OPENAI_API_BASE``/``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` apply),
or of the built-in offline demo model (``--model offline``,
:mod:`~memory_pipelines.apps.proxy.offline`); ``create_app(svc, model)`` builds it over
an open service.
A client changes one base URL and names itself with headers:

- ``X-Memory-Agent`` (required, unless the proxy runs with ``--passthrough``: then a
  request without it goes to the model untouched and nothing is recorded),
  ``X-Memory-User`` (else the request's ``user`` field), ``X-Memory-Company``,
  ``X-Memory-Run`` and ``X-Memory-Conversation`` (each generated per request when
  missing; the answer carries the ids in the same headers, plus ``X-Memory-Message``,
  the id of the recorded assistant message, which is also the completion's ``id``).
  A run of another agent, or a conversation recorded for another agent, user or
  company, is a 409: a turn never appends to or takes over someone else's.

``POST /v1/chat/completions``, one turn:

1. Before the call, one system message is put first in the messages: the agent's
   injection for the last user message (``svc.inject(ctx, text).message``), its write
   instructions and the write feedback of the run's previous turn, joined by blank
   lines (no system message when all three are empty). The instructions are
   :func:`~memory_pipelines.writes.protocol.chat_write_instructions` (plain text and a
   trailing ``memoryWrites`` block), or ``svc.write_instructions(agent_id)`` (a
   ``memoryWrites`` field in the JSON answer) when the client asked for JSON with
   ``response_format``. With a token budget (``max_injected_tokens``) the lowest-ranked
   examples, then the memory policy block, then the lowest-ranked notes are left out
   until the message fits (:mod:`~memory_pipelines.apps.proxy.tokens`); only the notes and
   examples sent are recorded as injected. When the request has ``tools`` and the
   agent may write, a ``memory_write`` function tool is added for tool-calling models
   (unless the client has a tool of that name).
2. The request's other fields (temperature, tools, response_format, ...) go to the model
   as given; the request's ``model`` is ignored: the proxy serves ``--model``.
3. After the call, the ``memoryWrites`` of the answer go through ``svc.write`` with the
   run's context: those of a trailing block or of a JSON answer
   (:func:`memory_pipelines.split_memory_writes`: the client gets the text around the
   block, the ``answer`` of an ``{"answer", "memoryWrites"}`` envelope, or, for other
   JSON and for a client that asked for JSON, the JSON without the field) and the
   arguments of ``memory_write`` tool calls (removed from ``tool_calls``; a turn left
   without calls finishes ``stop``). The client never sees them. The first 100 writes
   of an answer are written; the next turn's feedback says how many more were not. Concurrent turns'
   writes go through one group-commit writer, as in ``serve``
   (:class:`~memory_pipelines.apps.http.WriteQueue`; ``MEMORY_WRITE_QUEUE=off`` runs them
   in the request threads), and the injection events are buffered and flushed in batches.
   ``svc.format_write_feedback`` of those writes is kept in the SQL sources for the
   (agent, run) and delivered once, in the system message of the run's next turn, as the
   guide's "results arrive on the NEXT turn".
4. The exchange is recorded: the conversation, the last user message (an id derived from
   the conversation, its position and text, so a resent history is not stored twice),
   the assistant message as the client received it, and the agent run (``Completed``,
   success) so the Memory Manager extracts from it on its next cycle. An upstream error
   is answered in the OpenAI error format and recorded as a ``Failed`` run
   (``success=False``, the error message), never as a success.

Streaming (``"stream": true``): text answers stream through chunk by chunk, a trailing
``memoryWrites`` block held back from its fence on; an answer envelope's ``answer`` is
decoded and streamed as it arrives; other JSON is buffered to the end and sent stripped
before the finish chunk (:class:`~memory_pipelines.apps.proxy.turns.ChoiceFilter`). Lone
surrogates (a ``"\\ud800"`` escape) in any field of an answer, streamed or not, with or
without ``X-Memory-Agent``, become U+FFFD. ``memory_write`` tool-call deltas are held back;
other tool calls pass through (their indexes renumbered). The writes run and the turn is
recorded before the final ``data: [DONE]``. An upstream error in mid-stream is sent as an
``error`` event (what the OpenAI client raises on) and the run is recorded ``Failed``.

``GET /v1/models`` lists ``--model``. ``POST /v1/feedback`` ``{"conversation_id",
"message_id", "rating": 1-10, "comment"}`` stores a rating on a recorded message (the
rating extraction reads; a rating given after a cycle has mined the message is stored but
that message is not mined again). ``GET /healthz`` answers without a key.

API keys as for ``serve`` (:mod:`memory_pipelines.keys`): once the home
has a key, every ``/v1/...`` request needs ``Authorization: Bearer <secret>`` (the
OpenAI client's ``api_key``), and the turn's context must be inside the key's binding;
the proxy refuses a non-loopback host while the home has no key. The upstream model's
own key comes from the proxy's environment, never from the client.

Every error is in the OpenAI format ``{"error": {"message", "type", "param", "code"}}``:
401/403 for keys, 404 for an unknown agent, conversation or message, 400 for a bad
request, 413 for a body over ``--max-body-bytes`` (8 MiB by default), the upstream's
status for its client errors (and 503/504), 502 when the upstream fails otherwise (a 500,
connection refused, its own authentication) and 504 on its timeout (``--timeout``, 120 s
by default). Message text is
never logged at info level or above (ids, counts and statuses only).

Modules: :mod:`.app` builds the application (``create_app``) and serves it (``serve``);
:mod:`.routes` holds its routes and the key check; :mod:`.engine` the steps of a turn
over the service (check, inject, call the model, write, record); :mod:`.streaming` the
relay of a streamed answer; :mod:`.turns` what one turn carries (identity headers,
OpenAI-format errors, the stream filter); :mod:`.offline` the offline demo model;
:mod:`.tokens` the token counter and budget.
"""

from memory_pipelines.apps.proxy.app import create_app, serve
from memory_pipelines.apps.proxy.turns import (
    HEADERS,
    MEMORY_TOOL,
    MEMORY_TOOL_SPEC,
    ProxyError,
    split_memory_writes,
    tool_writes,
)

__all__ = [
    "HEADERS",
    "MEMORY_TOOL",
    "MEMORY_TOOL_SPEC",
    "ProxyError",
    "create_app",
    "serve",
    "split_memory_writes",
    "tool_writes",
]
