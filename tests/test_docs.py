"""Every code block of the README and of docs/ runs as its page says; every public name is in the reference.

A page is read as Markdown. Each fence has a language, and what is done with it depends on that language:

- ``python``: a whole script, run as ``python SCRIPT`` runs it in the page's own fresh directory (the
  blocks of a page run in order there, so a later block sees the files an earlier one wrote); it must
  exit 0. Each block is a process of its own, forked from the suite's forkserver (tests/_forkserver.py),
  which imported torch, diffusers and streamvae once: a fresh interpreter would spend ~3–8 s of a 2-core
  CPU importing them again for every block. The process gets the ``sys.path``, environment, working
  directory, exit status and stdout/stderr a fresh interpreter would have.
- ``sh`` / ``bash``: each line is a command (a ``\\`` at the end continues it), run by bash in the page's
  directory with this interpreter's ``bin`` first on PATH; it must exit 0. These stay real processes
  (``streamvae …``, ``torchrun …``, ``python -c …`` start fresh interpreters): they are what the reader
  types. A ``make X`` line is checked with ``make -n X`` in the repository (the target exists) instead
  of being run.
- ``json`` is parsed; ``text`` (output, diagrams) and the Sphinx directives ``{toctree}`` and ``{eval-rst}``
  are not run. Any other language, or none, fails.

An HTML comment on the line just before a fence changes that:

- ``<!-- file: NAME -->``: the block is written to ``NAME`` in the page's directory instead of being run.
- ``<!-- serve: /PATH -->``: the ``sh`` block's one command is a server. It runs on a free port (``8000``
  in it, and ``127.0.0.1:8000`` in the page's later blocks, become that port) in a process group of its
  own, until the page's later blocks have run against it; they start once ``GET /PATH`` answers.
- ``<!-- skip: needs a GPU -->`` (or ``needs several GPUs``, ``needs a download``): not run, the only
  reasons there are. A skipped ``python`` block is still compiled, so a syntax error fails.

The README's docs/ pages say so to their readers (docs/quickstart.md, the end): a snippet that stops working
fails CI. The Sphinx build itself (``make docs``, warnings as errors) runs in ``.ci/run``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import streamvae
from tests._forkserver import Finished, run_main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts),
]
#: pages whose commands start fresh interpreters that import torch (``torchrun``, ``streamvae``, a server):
#: 6–40 s each on a 2-core CPU; a page of python blocks alone takes 1–2 s (they fork from the forkserver)
SLOW_PAGES = {
    "docs/distributed.md",
    "docs/guides/cli.md",
    "docs/guides/many-gpus.md",
    "docs/guides/many-viewers.md",
    "docs/guides/realtime.md",
    "docs/guides/serve.md",
}
SKIP_REASONS = {"needs a GPU", "needs several GPUs", "needs a download"}
RUN_LANGUAGES = {"python", "sh", "bash"}
CHECKED_LANGUAGES = {"json", "text", "{toctree}", "{eval-rst}"}
#: a hang guard, not a time limit: the slowest block (a tiny pipeline, a two-rank torchrun) takes ~20 s
BLOCK_TIMEOUT = 300
#: how long a server may take to answer its first request (it imports torch and builds the demo VAE)
SERVER_START_TIMEOUT = 120
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARK = re.compile(r"^\s*<!--\s*(?P<key>file|serve|skip):\s*(?P<value>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page, with the marks on the lines just before it."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marks: dict[str, str]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        assert end < len(lines), f"{page.relative_to(ROOT)}:{index + 1}: a fence that is never closed"
        marks, above = {}, index - 1
        while above >= 0 and (mark := MARK.match(lines[above])):
            marks[mark["key"]] = mark["value"]
            above -= 1
        code = "\n".join(line[indent:] for line in lines[index + 1 : end]) + "\n"
        blocks.append(Block(page, index + 1, opening["info"].strip(), code, marks))
        index = end + 1
    return blocks


def commands_of(block: Block) -> Iterator[str]:
    """The block's commands: its lines (a trailing ``\\`` joins the next), less blanks and comments."""
    command = ""
    for line in block.code.splitlines():
        command += line
        if command.endswith("\\"):
            command = command[:-1] + " "
            continue
        if command.strip() and not command.lstrip().startswith("#"):
            yield command.strip()
        command = ""


def free_port() -> int:
    """A port nothing listens on, below the kernel's ephemeral range (32768 and up): there, no other
    process's ``bind(0)`` or outgoing connection takes it between this check and the server's bind."""
    while True:
        port = random.randrange(20_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def environment() -> dict[str, str]:
    """This interpreter's ``bin`` first on PATH: ``streamvae``, ``uvicorn``, ``torchrun`` and ``python`` are
    the ones installed with it (streamvae itself is installed editable, so it imports from anywhere)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)  # the blocks see what a user of the installed package sees
    return env


def text(output: str | bytes | None) -> str:
    """What a process wrote (TimeoutExpired gives bytes even for a run with ``text=True``)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run(command: list[str], block: Block, cwd: Path) -> None:
    """Run ``command`` (bash, or ``make -n``) in a process of its own; the block fails unless it exits 0."""
    try:
        result = subprocess.run(
            command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT
        )
    except subprocess.TimeoutExpired as error:
        finished = Finished(None, text(error.output), text(error.stderr))
    else:
        finished = Finished(result.returncode, result.stdout, result.stderr)
    check_exit(finished, command[-1], block)


def run_python(script: Path, block: Block) -> None:
    """``python SCRIPT`` in the script's folder, forked from the suite's forkserver (tests/_forkserver.py):
    what a fresh interpreter would do, less its ~3–8 s of importing torch and diffusers again."""
    finished = run_main([script.name], cwd=script.parent, env=environment(), timeout_s=BLOCK_TIMEOUT)
    check_exit(finished, script.name, block)


def check_exit(finished: Finished, name: str, block: Block) -> None:
    """The block fails unless ``name`` exited 0 within the hang guard; the message has what it wrote."""
    if finished.status is None:
        pytest.fail(
            f"{block.where}: {name!r} still running after {BLOCK_TIMEOUT} s:\n"
            f"{finished.stdout}\n{finished.stderr}"
        )
    if finished.status != 0:
        pytest.fail(
            f"{block.where}: {name!r} exited with {finished.status}\n"
            f"--- stdout\n{finished.stdout}\n--- stderr\n{finished.stderr}"
        )


@contextlib.contextmanager
def serving(command: str, path: str, block: Block, cwd: Path) -> Iterator[None]:
    """Run ``command`` (a server) in its own process group until the block ends, once ``GET path`` answers.

    Its output goes to files, not pipes: a grandchild that keeps a pipe open can never hang the test.
    """
    log = cwd / f"server-{block.line}.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, env=environment(), stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    port = re.search(r"--port[ =](\d+)", command)
    assert port is not None, f"{block.where}: a served command names its --port"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"{block.where}: {command!r} exited with {process.returncode}:\n{log.read_text()}"
                )
            try:
                httpx.get(f"http://127.0.0.1:{port[1]}{path}", timeout=5)
                if process.poll() is None:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"{block.where}: {path} no answer in {SERVER_START_TIMEOUT} s:\n{log.read_text()}"
                    )
                time.sleep(0.2)  # polling a process's port: there is no event to wait on
        yield
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (uvicorn shuts down), then SIGKILL to whatever is left of it
    after 20 s: the server past its deadline, or a grandchild that outlived it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=20)


def check_marks(block: Block) -> None:
    where = block.where
    if block.language not in RUN_LANGUAGES | CHECKED_LANGUAGES:
        pytest.fail(f"{where}: a fence needs a language, one of {sorted(RUN_LANGUAGES | CHECKED_LANGUAGES)}")
    if "skip" in block.marks and block.marks["skip"] not in SKIP_REASONS:
        pytest.fail(
            f"{where}: skip: {block.marks['skip']!r}; a block is skipped only because it {SKIP_REASONS}"
        )
    if "file" in block.marks and "/" in block.marks["file"]:
        pytest.fail(f"{where}: file: a name in the page's directory, not a path")
    if "serve" in block.marks and (
        block.language not in {"sh", "bash"} or len(list(commands_of(block))) != 1
    ):
        pytest.fail(f"{where}: serve: marks a sh block of one command")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=[pytest.mark.slow] if page_id(page) in SLOW_PAGES else []) for page in PAGES],
    ids=page_id,
)
def test_every_block_of_the_page_runs(page: Path, tmp_path: Path) -> None:
    blocks = blocks_of(page)
    for block in blocks:
        check_marks(block)
    port: int | None = None
    with contextlib.ExitStack() as servers:
        for block in blocks:
            code = block.code if port is None else block.code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            if "skip" in block.marks:
                if block.language == "python":
                    compile(code, block.where, "exec")
                elif block.language in {"sh", "bash"}:
                    run(["bash", "-n", "-c", code], block, tmp_path)  # parsed, not run
                continue
            if "file" in block.marks:
                (tmp_path / block.marks["file"]).write_text(code)
            elif block.language == "json":
                try:
                    json.loads(code)
                except ValueError as error:
                    pytest.fail(f"{block.where}: not JSON: {error}")
            elif block.language == "python":
                script = tmp_path / f"block-{block.line}.py"
                script.write_text(code)
                run_python(script, block)
            elif block.language in {"sh", "bash"} and "serve" in block.marks:
                port = free_port()
                (command,) = commands_of(block)
                servers.enter_context(
                    serving(re.sub(r"\b8000\b", str(port), command), block.marks["serve"], block, tmp_path)
                )
            elif block.language in {"sh", "bash"}:
                for command in commands_of(block):
                    if command.startswith("make "):
                        run(["bash", "-c", f"make -n {command.removeprefix('make ')}"], block, ROOT)
                    else:
                        run(["bash", "-c", command], block, tmp_path)


# ---- the reference ---------------------------------------------------------------------------------------

REFERENCE = DOCS / "reference"
DIRECTIVE = re.compile(r"^\.\. auto(?P<kind>\w+):: (?P<name>[\w.]+)(?P<options>(\n   :.*)*)", re.MULTILINE)


def public_modules() -> list[str]:
    """``streamvae`` and every module under it whose dotted name has no ``_`` part."""
    names = ["streamvae"]
    for module in pkgutil.walk_packages(streamvae.__path__, "streamvae."):
        if not any(part.startswith("_") for part in module.name.split(".")):
            names.append(module.name)
    return sorted(names)


def documented() -> tuple[set[str], set[str]]:
    """The names the reference pages document one by one, and the modules they document with ``:members:``."""
    names, modules = set(), set()
    for page in REFERENCE.glob("*.md"):
        for directive in DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            if directive["kind"] == "module" and re.search(r"^\s+:members:", directive["options"], re.M):
                modules.add(directive["name"])
            elif directive["kind"] != "module":
                names.add(directive["name"])
    return names, modules


@pytest.mark.parametrize("module_name", public_modules())
def test_every_public_name_has_its_entry_in_the_reference(module_name: str) -> None:
    module = importlib.import_module(module_name)
    names, modules = documented()
    public = getattr(module, "__all__", None)
    assert public is not None, f"{module_name} is public: it says what it exports in __all__"
    if module_name in modules:
        return
    missing = [name for name in public if f"{module_name}.{name}" not in names]
    page = f"docs/reference/{module_name}.md"
    assert not missing, f"{module_name}'s {missing} have no entry in the reference: add them to {page}"


def test_the_reference_documents_only_what_exists() -> None:
    names, modules = documented()
    for name in names:
        module_name, _, attribute = name.rpartition(".")
        assert hasattr(importlib.import_module(module_name), attribute), f"the reference documents {name}"
    assert modules <= set(public_modules()), modules - set(public_modules())
