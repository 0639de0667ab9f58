"""Entry points out of the domain: the command line, the servers and the job runners.

- :mod:`.cli`: the ``memory-pipelines`` command line (every command and its options);
- :mod:`.http`: the write/inject HTTP API (``serve``); :mod:`.proxy`: the OpenAI-compatible
  memory proxy; :mod:`.mcp_server`: the MCP tools over stdio;
- :mod:`.demo`: the demo home and its Dagster runs; :mod:`.runs`: executing the jobs of
  ``memory_pipelines.definitions.defs`` on a persistent instance;
- :mod:`.dask_cluster`: a local Dask cluster; :mod:`.llm_server`: a local model server;
  :mod:`.openai_stub`: a scripted OpenAI-compatible upstream (tests, benchmarks).

Nothing in the domain imports these modules. Import the module you need: this package
re-exports nothing, so importing one app never loads another's stack (Dagster, uvicorn).
"""

__all__: list[str] = []
