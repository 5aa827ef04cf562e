"""The display rules (serve/_display.py): what is escaped, what is kept, how a diff is cut up.

Each class of hidden character is escaped and counted; newline, tab and ordinary text in
any script are left exactly as they are; joining the pieces back gives the text again.
"""

from __future__ import annotations

from typing import Any

import pytest

from toolnexus_async import Request
from toolnexus_async.serve._display import Piece, display_of, escape_lines, is_hidden


def joined(lines: list[list[Piece]]) -> str:
    """The text again: escapes turned back into their characters."""

    def back(piece: Piece) -> str:
        if isinstance(piece, str):
            return piece
        return chr(int(piece["escape"].strip("⟨⟩")[2:], 16))

    return "\n".join("".join(back(p) for p in line) for line in lines)


@pytest.mark.parametrize(
    "char",
    [
        # bidi embeddings, overrides, isolates and marks
        *"\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c",
        # zero-width characters
        *"\u200b\u200c\u200d\u2060\ufeff",
        # C0 and C1 controls (a carriage return, an escape, NEL) and DEL
        *"\x00\x07\r\x0b\x0c\x1b\x7f\x85\x9b",
        # other format characters: a soft hyphen, an Arabic number sign, a tag character
        *"\u00ad\u0600\U000e0041",
        # line and paragraph separators, private use, unassigned, a lone surrogate
        *"\u2028\u2029\ue000\U000effff\ud800",
        # fillers drawn as nothing
        *"\u3164\u115f\u034f",
    ],
)
def test_each_hidden_character_is_escaped_and_counted(char: str) -> None:
    code = f"U+{ord(char):04X}"
    assert is_hidden(char)
    shown = display_of(Request("r1", "approval", f"a{char}b").to_dict())
    assert shown["hidden"] == 1
    ((first, escape, last),) = shown["prompt"]
    assert (first, last) == ("a", "b")
    assert escape["escape"] == f"⟨{code}⟩"
    assert escape["name"]  # the Unicode name, or the code for a nameless control


def test_the_escape_names_the_character() -> None:
    ((escape,),) = escape_lines("\u202e")
    assert escape == {"escape": "⟨U+202E⟩", "name": "RIGHT-TO-LEFT OVERRIDE"}
    ((escape,),) = escape_lines("\x1b")
    assert escape == {"escape": "⟨U+001B⟩", "name": "U+001B"}


def test_newline_splits_lines_and_tab_and_spaces_are_kept() -> None:
    text = "echo ok\nrm -rf ./victim\n\tindented  twice\n"
    lines = escape_lines(text)
    assert lines == [["echo ok"], ["rm -rf ./victim"], ["\tindented  twice"], []]
    assert joined(lines) == text


@pytest.mark.parametrize(
    "text",
    [
        "Café crème",
        "مرحبا بالعالم",  # Arabic letters: right-to-left, but no control
        "שלום",
        "日本語のテキスト",
        "emoji 😀 and a flag 🇫🇷",
        "a no-break\u00a0space",
    ],
)
def test_ordinary_text_in_any_script_is_untouched(text: str) -> None:
    assert escape_lines(text) == [[text]]
    assert display_of(Request("r1", "approval", text).to_dict())["hidden"] == 0


def test_the_bidi_command_is_shown_in_the_order_it_runs() -> None:
    command = "echo 'done \u202e; rm -rf ./victim #\u202c' ; \u2067echo x\u2069"
    (line,) = escape_lines(command)
    shown = "".join(p if isinstance(p, str) else p["escape"] for p in line)
    assert shown == "echo 'done ⟨U+202E⟩; rm -rf ./victim #⟨U+202C⟩' ; ⟨U+2067⟩echo x⟨U+2069⟩"
    assert joined([line]) == command


def test_the_data_is_shown_field_by_field_and_left_unchanged() -> None:
    command = "echo \u202eok"
    data: dict[str, Any] = {
        "tool": "bash",
        "arguments": {"command": command},
        "command": command,
        "amount_eur": 40,
        "diff": "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n keep\n-old\u200b\n+new\n"
        "\\ No newline at end of file\n",
    }
    request = Request("r1", "approval", f"Run {command}?", data=data)
    wire = request.to_dict()
    shown = display_of(wire)
    assert wire["data"] == data and wire["data"]["arguments"] == {"command": command}
    # prompt 1, arguments 1, command 1, diff 1
    assert shown["hidden"] == 4
    fields = {f["key"]: f for f in shown["fields"]}
    assert [f["key"] for f in shown["fields"]] == list(data)
    assert fields["tool"] == {"key": "tool", "kind": "text", "lines": [["bash"]]}
    assert fields["amount_eur"] == {"key": "amount_eur", "kind": "value"}
    assert fields["arguments"]["kind"] == "json"
    assert joined(fields["arguments"]["lines"]) == '{\n  "command": "echo \u202eok"\n}'
    diff = fields["diff"]
    assert diff["kind"] == "diff"
    assert [line["mark"] for line in diff["lines"]] == [
        "file",
        "file",
        "hunk",
        "context",
        "del",
        "add",
        "note",
    ]
    assert diff["lines"][4]["pieces"] == [
        "-old",
        {"escape": "⟨U+200B⟩", "name": "ZERO WIDTH SPACE"},
    ]


def test_a_url_is_shown_too() -> None:
    request = Request("r1", "authorization", "Log in", url="https://example.com/\u202eevil")
    shown = display_of(request.to_dict())
    assert shown["hidden"] == 1
    assert joined(shown["url"]) == "https://example.com/\u202eevil"
