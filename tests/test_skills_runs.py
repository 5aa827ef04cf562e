"""Agent Skills in runs: the catalogue in the request the provider receives, the skill
loaded through the tool, its script run only once a person approved it, a run halted with
a skill loaded that another process resumes, and ``serve --skills`` (issue 40)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio

from toolnexus_async import LlmClient, Message, Toolkit, ToolReturn
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.skills import SkillSet
from toolnexus_async.testing import MockTransport, json_response, reply, tool_call

ROOT = Path(__file__).resolve().parent.parent


def deploy_skill(folder: Path) -> Path:
    """A skill whose instructions say to run its script, which leaves a mark."""
    base = folder / "deploy"
    (base / "scripts").mkdir(parents=True)
    (base / "SKILL.md").write_text(
        "---\nname: deploy\ndescription: Ship a release to production.\n---\n"
        "Run scripts/mark.py with the release name, then read notes.md.\n",
        encoding="utf-8",
    )
    (base / "scripts" / "mark.py").write_text(
        "import sys, pathlib\npathlib.Path(sys.argv[1]).write_text('shipped')\n", encoding="utf-8"
    )
    (base / "notes.md").write_text("Tell the team in #releases.\n", encoding="utf-8")
    (folder / "triage").mkdir()
    (folder / "triage" / "SKILL.md").write_text(
        "---\nname: triage\ndescription: Sort incoming tickets.\n---\nLabel them.\n",
        encoding="utf-8",
    )
    return base


def openai_reply(message: dict[str, Any]) -> Any:
    return json_response({"choices": [{"message": message, "finish_reason": "stop"}]})


async def test_the_catalogue_is_in_the_system_prompt_the_provider_receives(tmp_path: Path) -> None:
    deploy_skill(tmp_path)
    transport = MockTransport(lambda request: openai_reply({"role": "assistant", "content": "ok"}))
    async with LlmClient(
        "http://model.test/v1", model="m", system_prompt="Be brief.", transport=transport
    ) as client:
        async with Toolkit.create(builtins=False, skills=[tmp_path]) as toolkit:
            await client.run("ship 1.2", toolkit)
        async with Toolkit.create(builtins=False) as bare:
            await client.run("ship 1.2", bare)
    with_skills, without = transport.body(0), transport.body(1)
    system = with_skills["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\nSkills are")
    assert "- deploy: Ship a release to production." in system["content"]
    assert "- triage: Sort incoming tickets." in system["content"]
    assert "Run scripts/mark.py" not in json.dumps(with_skills)  # instructions load on demand
    assert [t["function"]["name"] for t in with_skills["tools"]] == ["skill"]
    assert with_skills["tools"][0]["function"]["parameters"]["properties"]["name"]["enum"] == [
        "deploy",
        "triage",
    ]
    assert without["messages"][0] == {"role": "system", "content": "Be brief."}
    assert "tools" not in without


def skilled_model(mark: Path) -> Any:
    """Loads the deploy skill, runs its script with bash, reads its notes, then ends."""

    def model(messages: list[Message], tools: list[Any]) -> Any:
        done = [m for m in messages if isinstance(m, ToolReturn)]
        if not done:
            return reply(tool_call("skill", {"name": "deploy"}, id="c_load"))
        if len(done) == 1:
            base = done[0].output.split("Its folder: ")[1].split(" (")[0]
            command = f"{sys.executable} {base}/scripts/mark.py {mark}"
            return reply(tool_call("bash", {"command": command}, id="c_run"))
        if len(done) == 2:
            return reply(tool_call("skill", {"name": "deploy", "file": "notes.md"}, id="c_notes"))
        return "done: " + done[-1].output

    return model


RESUME = textwrap.dedent(
    """
    import sys
    import anyio
    from toolnexus_async import Answer, LlmClient, Toolkit
    from toolnexus_async.durable import SqliteRunStore, resume_stored
    from tests.test_skills_runs import skilled_model
    from pathlib import Path

    async def main(store_path, skills, mark, request_id):
        async with SqliteRunStore(store_path) as store:
            async with LlmClient.in_process(skilled_model(Path(mark))) as client:
                toolkit = Toolkit.create(skills=[skills], approve="ask", workdir=skills)
                async with toolkit:
                    done = await resume_stored(client, toolkit, store, Answer(request_id, True))
        print(done.status, done.text, sep="|")

    anyio.run(main, *sys.argv[1:])
    """
)


async def test_a_skills_script_runs_only_once_approved_even_after_a_halt_in_another_process(
    tmp_path: Path,
) -> None:
    skills = tmp_path / "skills"
    deploy_skill(skills)
    mark = tmp_path / "mark.txt"
    store_path = tmp_path / "runs.sqlite"
    async with LlmClient.in_process(skilled_model(mark)) as client:
        toolkit = Toolkit.create(skills=[skills], workdir=skills)
        async with toolkit:
            halted = await client.run("ship 1.2", toolkit)
    # The skill is loaded, and the script it asks for waits for a person: nothing ran.
    assert halted.status == "pending" and halted.pending is not None
    loaded = halted.tool_calls[0]
    assert loaded.call.name == "skill" and "Run scripts/mark.py" in loaded.result.output
    assert halted.pending.data is not None and halted.pending.data["tool"] == "bash"
    assert "scripts/mark.py" in halted.pending.data["arguments"]["command"]
    assert not mark.exists()
    async with SqliteRunStore(store_path) as store:
        await store.save(halted)
    # Another process, with the same skills, approves it: the script runs, and the skill is
    # still known there (its notes are read through it).
    with anyio.fail_after(120):
        done = await anyio.run_process(
            [
                sys.executable,
                "-c",
                RESUME,
                str(store_path),
                str(skills),
                str(mark),
                halted.pending.id,
            ],
            cwd=ROOT,
            check=False,
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    assert out.strip().startswith("done|done:") and "Tell the team in #releases." in out
    assert mark.read_text() == "shipped"


def test_serve_takes_skills_folders(monkeypatch: Any, tmp_path: Path) -> None:
    """``serve --skills DIR`` (repeatable): every run's toolkit has the skills' tool and
    catalogue; a folder that holds no skill is left out with a warning."""
    from aiohttp import web

    import toolnexus_async.serve as serve
    from toolnexus_async._cli import main
    from toolnexus_async.serve._app import SERVE

    deploy_skill(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    seen: dict[str, Any] = {}

    async def fake_run_server(app: web.Application, **kwargs: Any) -> None:
        seen["toolkit"] = app[SERVE].toolkit

    monkeypatch.setattr(serve, "run_server", fake_run_server)
    store = str(tmp_path / "runs.sqlite")
    argv = [
        "serve",
        "--store",
        store,
        "--skills",
        str(tmp_path / "a"),
        "--skills",
        str(tmp_path / "empty"),
    ]
    assert main([*argv, "--insecure-no-auth"]) == 0
    toolkit = seen["toolkit"]
    assert "skill" in {tool.name for tool in toolkit.specs}
    assert toolkit.instructions is not None and "- deploy: Ship a release" in toolkit.instructions
    assert SkillSet.load([tmp_path / "empty"]).names == ()
