"""README.md's Python runs as a newcomer runs it: each ```python block saved as a script
and started with ``python example.py`` in a fresh process (so a block that leans on names it
never defines, or on top-level ``await``, fails here). ```python-norun blocks are compiled.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_docs import RUN, SHOW_ONLY, compile_block, fenced_blocks

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_has_a_runnable_first_block():
    """The first code block a reader meets is the script they can run."""
    blocks = fenced_blocks(README)
    assert blocks[0][0] == RUN


def test_readme_python_blocks_run_as_scripts(tmp_path):
    """Each block runs as `python example.py`, answering "y" to the approval it asks."""
    scripts = [body for lang, _, body in fenced_blocks(README) if lang == RUN]
    assert scripts
    for body in scripts:
        script = tmp_path / "example.py"
        script.write_text(body, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)],
            input="y\n",
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
        assert 0 == done.returncode, done.stderr
        assert "done - The payment: sent 120 EUR" in done.stdout
        assert "declined" not in done.stdout


def test_readme_declined_payment_is_reported(tmp_path):
    """Answering "n" declines: the model hears it and the run still ends."""
    body = next(body for lang, _, body in fenced_blocks(README) if lang == RUN)
    script = tmp_path / "example.py"
    script.write_text(body, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        input="n\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    assert "sent" not in done.stdout.split("approve?")[-1]
    assert "declined: Pay 120 EUR?" in done.stdout  # told apart from an approved run


def test_readme_shown_blocks_compile():
    """The provider line is shown, not run; it must still be valid Python."""
    shown = [(line, body) for lang, line, body in fenced_blocks(README) if lang == SHOW_ONLY]
    assert shown
    for line, body in shown:
        compile_block(README, line, body)


def test_extras_install_from_the_checkout():
    """The package is on no index: README.md and docs/ install an extra from the checkout
    (``pip install -e '.[mcp]'``), never by the package's name."""
    pages = [README, *sorted((README.parent / "docs").glob("*.md"))]
    by_name = [
        f"{page.name}: {line.strip()}"
        for page in pages
        for line in page.read_text(encoding="utf-8").splitlines()
        if "pip install" in line and "toolnexus-async[" in line
    ]
    assert by_name == []
    said = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    assert "pip install -e '.[mcp]'" in said and "pip install -e '.[postgres]'" in said
