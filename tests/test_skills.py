"""Agent Skills: discovery, what is skipped and why, the allow/deny filter, the ``skill``
tool, and reading a skill's files under the workspace rule (issue 40)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolnexus_async import UsageError
from toolnexus_async.skills import Skill, SkillFormatError, SkillSet, SkillTool


def write_skill(
    folder: Path, name: str | None = None, description: str = "Use it.", body: str = ""
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    front = [] if name is None else [f"name: {name}"]
    front.append(f"description: {description}")
    (folder / "SKILL.md").write_text(
        "---\n" + "\n".join(front) + "\n---\n" + body, encoding="utf-8"
    )
    return folder


def test_skills_are_found_in_nested_folders_in_name_order(tmp_path: Path) -> None:
    write_skill(tmp_path / "b" / "pdf", "pdf", "Read PDFs.", "Use pdftotext.")
    write_skill(tmp_path / "a" / "deep" / "er" / "csv", "csv", "Clean CSV files.")
    write_skill(tmp_path / "pdf2" / "pdf", "pdf", "A second pdf.")  # a duplicate, found later
    # A skill's subfolders are its files, not more skills.
    write_skill(tmp_path / "b" / "pdf" / "inner", "inner", "Not a skill of its own.")
    found = SkillSet.load([tmp_path])
    assert found.names == ("csv", "pdf")
    pdf = found.get("pdf")
    assert pdf is not None and pdf.instructions == "Use pdftotext."
    assert pdf.base_dir == tmp_path / "b" / "pdf"
    [duplicate] = found.skipped
    assert duplicate.where.endswith(os.path.join("pdf2", "pdf", "SKILL.md"))
    assert duplicate.reason.startswith("duplicate of 'pdf' at ")


def test_git_and_node_modules_are_not_entered_and_a_symlink_loop_ends(tmp_path: Path) -> None:
    write_skill(tmp_path / ".git" / "hidden", "hidden", "In .git.")
    write_skill(tmp_path / "node_modules" / "pkg", "pkg", "In node_modules.")
    write_skill(tmp_path / "tools" / "lint", "lint", "Lint code.")
    (tmp_path / "tools" / "loop").symlink_to(tmp_path, target_is_directory=True)
    found = SkillSet.load([tmp_path])
    assert found.names == ("lint",)
    assert found.skipped == ()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no front matter here", "no front matter"),
        ("---\nname: [unclosed\n---\n", "malformed front matter"),
        ("---\n- a\n- b\n---\n", "a mapping of keys expected, got list"),
        ("---\ndescription: nameless\n---\n", "no name"),
        ("---\nname: bad\n---\n", "no description"),
        ("---\nname: Bad_Name\ndescription: x\n---\n", "is not a skill name"),
        ("---\nname: other\ndescription: x\n---\n", "is not its folder's name 'bad'"),
        (
            "---\nname: !!python/object:os.system ls\ndescription: x\n---\n",
            "malformed front matter",
        ),
    ],
)
def test_each_bad_skill_is_skipped_with_its_reason(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "SKILL.md").write_text(text, encoding="utf-8")
    write_skill(tmp_path / "good", "good")
    found = SkillSet.load([tmp_path])
    assert found.names == ("good",)
    [skipped] = found.skipped
    assert reason in skipped.reason and skipped.where.endswith("SKILL.md")


def test_unreadable_and_missing_are_skipped_never_raised(tmp_path: Path) -> None:
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "SKILL.md").write_bytes(b"---\nname: binary\n\xff\xfe---\n")
    (tmp_path / "dangling").mkdir()
    (tmp_path / "dangling" / "SKILL.md").symlink_to(tmp_path / "nowhere")
    found = SkillSet.load([tmp_path, tmp_path / "absent"])
    reasons = {s.where: s.reason for s in found.skipped}
    assert found.names == ()
    assert reasons == {
        str(tmp_path / "binary" / "SKILL.md"): "unreadable: not UTF-8 text",
        str(tmp_path / "dangling" / "SKILL.md"): "unreadable: not a regular file",
        str(tmp_path / "absent"): "not a folder",
    }


def test_allow_and_deny_filter_and_refuse_unknown_names(tmp_path: Path) -> None:
    for name in ("csv", "pdf", "xlsx"):
        write_skill(tmp_path / name, name)
    assert SkillSet.load([tmp_path], allow=["pdf", "csv"], deny=["csv"]).names == ("pdf",)
    assert SkillSet.load([tmp_path], deny=["xlsx"]).names == ("csv", "pdf")
    with pytest.raises(UsageError, match=r"unknown skill name\(s\) 'pfd'.*found: csv, pdf, xlsx"):
        SkillSet.load([tmp_path], allow=["pfd"])
    with pytest.raises(UsageError, match="unknown skill name"):
        SkillSet.load([tmp_path], deny=["docx"])
    with pytest.raises(UsageError, match="a list of names, got the string 'pdf'"):
        SkillSet.load([tmp_path], allow="pdf")


def test_skills_given_as_data_take_part_and_are_checked() -> None:
    given = Skill("triage", "Sort incoming tickets.", "Label each ticket.")
    found = SkillSet.load([given])
    assert found.names == ("triage",) and found.get("triage") is given
    with pytest.raises(SkillFormatError, match="no description"):
        Skill("triage", " ", "x")
    with pytest.raises(UsageError, match="a folder or a Skill expected, got int"):
        SkillSet.load([3])  # type: ignore[list-item]


def test_the_catalogue_lists_names_and_descriptions_only_when_there_are_skills(
    tmp_path: Path,
) -> None:
    assert SkillSet().catalogue() is None
    write_skill(tmp_path / "pdf", "pdf", "Read PDFs.", "SECRET BODY")
    text = SkillSet.load([tmp_path]).catalogue()
    assert text is not None and "- pdf: Read PDFs." in text and "`skill` tool" in text
    assert "SECRET BODY" not in text  # instructions load on demand only


async def test_the_skill_tool_loads_instructions_lists_files_and_reads_them_confined(
    tmp_path: Path,
) -> None:
    base = write_skill(tmp_path / "pdf", "pdf", "Read PDFs.", "Run scripts/extract.py on the file.")
    (base / "scripts").mkdir()
    (base / "scripts" / "extract.py").write_text("print('text')\n", encoding="utf-8")
    (base / "reference.md").write_text("line one\nline two\n", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("not the skill's", encoding="utf-8")
    (base / "escape.txt").symlink_to(tmp_path / "secret.txt")
    tool = SkillTool(SkillSet.load([tmp_path]))
    assert tool.input_schema["properties"]["name"]["enum"] == ["pdf"]

    loaded = await tool.execute({"name": "pdf"})
    assert not loaded.is_error and loaded.metadata == {"skill": "pdf"}
    assert "Run scripts/extract.py on the file." in loaded.output
    assert f"Its folder: {base}" in loaded.output
    assert "- escape.txt\n- reference.md\n- scripts/extract.py" in loaded.output
    assert "SKILL.md" not in loaded.output.split("Files of this skill")[1]

    read = await tool.execute({"name": "pdf", "file": "reference.md", "offset": 2})
    assert not read.is_error and read.output == "     2\tline two"
    for outside in ("../secret.txt", str(tmp_path / "secret.txt"), "escape.txt"):
        refused = await tool.execute({"name": "pdf", "file": outside})
        assert refused.is_error and "secret" not in refused.output.split(":", 2)[-1].replace(
            outside, ""
        )
    unknown = await tool.execute({"name": "pfd"})
    assert unknown.is_error and unknown.output == "skill: no skill named 'pfd' (available: pdf)"


async def test_the_file_list_is_bounded(tmp_path: Path) -> None:
    base = write_skill(tmp_path / "big", "big")
    for n in range(120):
        (base / f"f{n:03}.txt").write_text("x", encoding="utf-8")
    loaded = await SkillTool(SkillSet.load([tmp_path])).execute({"name": "big"})
    assert "(50 of 120; read one with file=...)" in loaded.output
    assert "- f049.txt" in loaded.output and "- f050.txt" not in loaded.output
