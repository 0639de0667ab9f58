"""``bench extraction --judge litellm --model M`` end to end through litellm, against a
scripted OpenAI-compatible model on loopback (no network): the benchmark's prompts reach
the model, its notes come back through the judge's checks, and they are scored."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi import FastAPI, Request

from memory_pipelines.apps.http.serving import serving_in_thread
from memory_pipelines.bench import extraction
from memory_pipelines.errors import ValidationError


def _scripted_model() -> FastAPI:
    """Answers "extract notes" with one note per user message that states an adoption or
    a training plan (the rest: no notes), every other task with an empty answer."""
    app = FastAPI()
    app.state.tasks = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        data = json.loads(re.search(r"<data>\n(.*)\n</data>", user, re.S).group(1))
        if "extract DURABLE notes" in system:
            app.state.tasks.append("notes")
            notes = [
                {
                    "content": "User " + m["text"].split(" ", 1)[1].replace("I'm", "is"),
                    "type": "Context",
                    "scopeLevel": "user",
                    "confidence": 90,
                    "sourceMessageId": m["id"],
                    "mergeWithExistingIds": [],
                }
                for m in data["messages"]
                if m["role"] == "user" and re.search(r"adopted|training", m["text"])
            ]
            answer: dict[str, Any] = {"notes": notes}
        else:
            app.state.tasks.append("other")
            answer = {"examples": []}
        message = {"role": "assistant", "content": json.dumps(answer)}
        return {
            "id": "scripted",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    return app


@pytest.mark.slow  # litellm and a served model: ~25 s
def test_bench_extraction_runs_through_the_litellm_judge(tmp_path, monkeypatch, capsys):
    from test_bench_extraction import SAMPLE

    data = tmp_path / "synth.json"
    data.write_text(json.dumps([SAMPLE]))
    model = _scripted_model()
    with serving_in_thread(model) as url:
        monkeypatch.setenv("OPENAI_API_BASE", url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "scripted")
        args = ["--data", str(data), "--embedder", "hash", "--judge", "litellm"]
        assert extraction.main([*args, "--model", "openai/scripted"]) == 0
    out = capsys.readouterr().out
    assert "judge litellm openai/scripted" in out
    assert model.state.tasks.count("notes") == 2  # one extraction per session
    row = next(line for line in out.splitlines() if line.startswith("| synth-1"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 3 observations, 2 notes from their evidence turns: recall 2/3, precision 1
    assert cells[2:5] == ["3", "2", "0.667"] and float(cells[5]) == 1.0


def test_judge_litellm_needs_a_model(tmp_path):
    with pytest.raises(ValidationError, match="--model"):
        extraction.main(["--data", str(tmp_path / "x.json"), "--judge", "litellm"])
