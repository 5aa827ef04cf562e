"""HTML to markdown or plain text with the standard library's ``html.parser`` only.

Rule of this module: pure text work, no I/O. Headings, paragraphs, links as
``[text](href)`` (resolved against the page URL), lists, emphasis, code and ``pre`` survive;
scripts, styles and other content no reader sees are dropped.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

__all__ = ("html_to_markdown", "html_to_text")

# Their content is never text a reader sees.
_SKIP = frozenset(
    {"script", "style", "noscript", "template", "svg", "title", "iframe", "object", "canvas"}
)
_BLOCK = frozenset(
    "p div section article header footer main nav aside blockquote figure figcaption form "
    "fieldset address details summary dl table body".split()
)
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_WRAP = {"strong": "**", "b": "**", "em": "*", "i": "*"}
_SPACES = re.compile(r"\s+")
_BLANK_RUNS = re.compile(r"\n{3,}")


class _Converter(HTMLParser):
    """Streams HTML into markdown (or plain text) in a list of output pieces."""

    def __init__(self, markdown: bool, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.markdown = markdown
        self.base_url = base_url
        self.out: list[str] = []
        self.skip = 0
        self.pre = 0
        self.lists: list[list[Any]] = []  # [tag, next number] per open ul/ol
        # Open inline elements rewritten at their end tag: (tag, start index in out, href).
        self.inline: list[tuple[str, int, str | None]] = []
        # Index of a list marker ("- ") nothing has followed yet: a <p> opening the item
        # must not push its text onto the next line.
        self.item_marker: int | None = None

    def _tail(self) -> str:
        for piece in reversed(self.out):
            if piece:
                return piece[-1]
        return "\n"

    def _newlines(self, count: int) -> None:
        """End the current line, leaving at least ``count`` newlines (none at the start)."""
        # Only the tail is touched: rejoining the whole output here would make a page with
        # many paragraphs quadratic.
        if self.item_marker == len(self.out) - 1:
            return
        # Pieces an open inline element owns are left in place, so its start index holds.
        floor = self.inline[-1][1] if self.inline else 0
        have = 0
        while len(self.out) > floor:
            piece = self.out.pop()
            kept = piece.rstrip(" \n")
            have += piece[len(kept) :].count("\n")
            if kept:
                self.out.append(kept)
                break
        if len(self.out) > 0:
            self.out.append("\n" * max(have, count))

    def _drop_empty_item(self) -> None:
        if self.item_marker is not None and self.item_marker == len(self.out) - 1:
            self.out.pop()
            if self.lists and self.lists[-1][0] == "ol":
                self.lists[-1][1] -= 1
        self.item_marker = None

    def _block(self) -> None:
        # Inside a list item a paragraph must not break the list apart.
        self._newlines(1 if self.lists else 2)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self.skip += 1
            return
        if self.skip:
            return
        attr = dict(attrs)
        if tag in _HEADINGS:
            self._newlines(2)
            if self.markdown:
                self.out.append("#" * _HEADINGS[tag] + " ")
        elif tag in _BLOCK:
            self._block()
        elif tag == "br":
            self.out.append("\n")
        elif tag == "hr":
            self._newlines(2)
            self.out.append("---" if self.markdown else "")
            self._newlines(2)
        elif tag in ("ul", "ol"):
            self._newlines(1 if self.lists else 2)
            self.lists.append([tag, 1])
        elif tag == "li":
            self._drop_empty_item()
            self._newlines(1)
            indent = "  " * max(0, len(self.lists) - 1)
            if self.lists and self.lists[-1][0] == "ol":
                marker = f"{self.lists[-1][1]}. "
                self.lists[-1][1] += 1
            else:
                marker = "- "
            self.out.append(indent + marker)
            self.item_marker = len(self.out) - 1
        elif tag == "tr":
            self._newlines(1)
        elif tag in ("td", "th"):
            if self._tail() != "\n":
                self.out.append(" | ")
        elif tag == "pre":
            self._newlines(2)
            if self.markdown:
                self.out.append("```\n")
            self.pre += 1
        elif tag == "a":
            href = attr.get("href")
            if href and not href.lower().startswith(("javascript:", "#")):
                href = urljoin(self.base_url, href)
            else:
                href = None
            self.inline.append(("a", len(self.out), href))
        elif (tag == "code" and not self.pre) or tag in _WRAP:
            self.inline.append((tag, len(self.out), None))
        elif tag == "img" and self.markdown:
            src = attr.get("src")
            if src:
                alt = _SPACES.sub(" ", attr.get("alt") or "").strip()
                self.out.append(f"![{alt}]({urljoin(self.base_url, src)})")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # A self-closed <script/> opens nothing, so it must not start a skipped region.
        if tag in _SKIP:
            return
        self.handle_starttag(tag, attrs)
        if tag in ("a", "code", *_WRAP):
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skip = max(0, self.skip - 1)
            return
        if self.skip:
            return
        if tag in _HEADINGS or tag in _BLOCK:
            self._newlines(2 if tag in _HEADINGS else (1 if self.lists else 2))
        elif tag in ("ul", "ol"):
            self._drop_empty_item()
            if self.lists:
                self.lists.pop()
            self._newlines(1 if self.lists else 2)
        elif tag == "pre" and self.pre:
            self.pre -= 1
            if self.markdown:
                self._newlines(1)
                self.out.append("```")
            self._newlines(2)
        elif any(open_tag == tag for open_tag, _, _ in self.inline):
            # Browsers forgive misnested inline tags; close everything opened inside too.
            while self.inline:
                open_tag, start, href = self.inline.pop()
                self._close_inline(open_tag, start, href)
                if open_tag == tag:
                    break

    def _close_inline(self, tag: str, start: int, href: str | None) -> None:
        inner = _SPACES.sub(" ", "".join(self.out[start:])).strip()
        del self.out[start:]
        if not self.markdown or (not inner and tag != "a"):
            self.out.append(inner)
            return
        if tag == "a":
            if href is None:
                self.out.append(inner)
            elif inner or href:
                self.out.append(f"[{inner or href}]({href})")
        elif tag == "code":
            fence = "``" if "`" in inner else "`"
            self.out.append(f"{fence}{inner}{fence}")
        else:
            self.out.append(f"{_WRAP[tag]}{inner}{_WRAP[tag]}")

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.pre:
            # HTML drops the newline that directly follows <pre>.
            if self.out and self.out[-1] == "```\n" and data.startswith("\n"):
                data = data[1:]
            self.out.append(data)
            return
        text = _SPACES.sub(" ", data)
        if self._tail() in " \n":
            text = text.lstrip(" ")
        if text:
            self.out.append(text)

    def result(self) -> str:
        self.close()
        while self.inline:
            self._close_inline(*self.inline.pop())
        lines = [line.rstrip() for line in "".join(self.out).split("\n")]
        return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")


def html_to_markdown(html: str, base_url: str = "") -> str:
    """Markdown for a page: headings, links as ``[text](href)``, lists, code; no scripts."""
    converter = _Converter(True, base_url)
    converter.feed(html)
    return converter.result()


def html_to_text(html: str, base_url: str = "") -> str:
    """The readable text of a page, with its paragraphs and list items on their own lines."""
    converter = _Converter(False, base_url)
    converter.feed(html)
    return converter.result()


# --- the tool ----------------------------------------------------------------------------
