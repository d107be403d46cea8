"""Sphinx configuration of the streamvae site (``make docs``).

Why Sphinx (with furo, MyST and autodoc) and not mkdocs-material with mkdocstrings: streamvae's docstrings
are reStructuredText and cross-reference each other with Sphinx roles (``:class:``, ``:func:``,
``:meth:``, ``:attr:`` — several hundred of them). Sphinx resolves each role to the page of its target and,
built nitpicky (``-n -W``), fails on one that does not resolve; mkdocstrings would show them as raw text.
The pages stay Markdown (MyST), readable on GitHub too, and the reference is generated from the docstrings
by autodoc, one page per public module (``reference/``).

There is no intersphinx: the build runs without a network. So references to other packages' names (torch,
anyio, numpy, PyAV, Starlette, diffusers, the standard library) cannot resolve, and ``nitpick_ignore_regex``
below lists those packages, and only those: a reference to a ``streamvae`` name that does not resolve
fails the build.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import sphinx.util.inspect
import sphinx.util.typing
from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

logger = logging.getLogger(__name__)

project = "streamvae"
html_title = "streamvae"
author = "the streamvae authors"
copyright = "the streamvae authors"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["streamvae.css"]
html_show_sourcelink = False

# MyST: ```{directive} fences and ::: fences; `#anchor` links to headings of three levels; a Markdown
# link to a page that does not exist is a warning (so a failure under -W), not an external URL.
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
myst_all_links_external = False
# Only these are URLs (not checked: the build has no network); any other link target is a page, a heading
# or a file of the site, and must exist.
myst_url_schemes = {"http": None, "https": None, "mailto": None}

# autodoc: each name documented where users import it (reference/*.md names it as streamvae.X).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
autodoc_default_options = {"members": True}
# A long signature gets a parameter a line instead of one line running off the page.
python_maximum_signature_line_length = 88
# Annotations show as written (``Tensor``, ``SessionOptions``), not fully qualified.
python_use_unqualified_type_names = True
add_module_names = False

nitpicky = True
# Names of other packages and of the standard library: without intersphinx they cannot resolve (see the
# top of this file). Never a streamvae name.
_EXTERNAL = (
    r"(torch|anyio|av|numpy|np|starlette|fastapi|uvicorn|diffusers|accelerate|safetensors|httpx|trio"
    r"|rich|argparse|asyncio|collections|concurrent|contextlib|dataclasses|datetime|enum|fractions|logging"
    r"|os|pathlib|threading|types|typing|typing_extensions|wave|weakref|socket|subprocess|io|abc|time|c2pa)"
)
nitpick_ignore_regex = [
    (r"py:.*", _EXTERNAL + r"(\..*)?"),
    # The same, as annotations spell them after ``from torch import Tensor`` and the like.
    (r"py:class", r"Tensor|Path|Fraction|timedelta|AutoencoderKL\w*|Kandinsky6SRVAE"),
    # SessionOptions.chunk_transform's alias, ``Callable[[Tensor], Tensor]``, as its annotation spells it.
    (r"py:class", r"ChunkTransform"),
]


def _public_modules() -> list[str]:
    """``streamvae`` and every module under it whose dotted name has no ``_`` part (what users import)."""
    import streamvae

    found = ["streamvae"]
    for module in pkgutil.walk_packages(streamvae.__path__, "streamvae."):
        if not any(part.startswith("_") for part in module.name.split(".")):
            found.append(module.name)
    return found


_PUBLIC_MODULES = _public_modules()


def _public_name(target: str) -> str | None:
    """The public name (``streamvae.models.ChunkedDecoder``) of an object named by its private home.

    Annotations and ``__module__`` name a subpackage's objects by the private module that defines them
    (``streamvae.models._base.ChunkedDecoder``); the reference documents them where users import them. Only
    the same object exported by a public module counts: anything else stays unresolved, and fails.
    """
    module_name, _, rest = target.partition("._")
    if not rest or not module_name.startswith("streamvae"):
        return None
    private_module, _, qualname = f"_{rest}".partition(".")
    head, _, member = qualname.partition(".")
    try:
        home = importlib.import_module(f"{module_name}.{private_module}")
        obj = getattr(home, head)
    except (ImportError, AttributeError):
        return None
    for public_module in _PUBLIC_MODULES:
        module = importlib.import_module(public_module)
        for name in getattr(module, "__all__", ()):
            if getattr(module, name, None) is obj:
                return ".".join(part for part in (public_module, name, member) if part)
    return None


def _resolve_private_homes(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.TextElement
) -> nodes.Element | None:
    if node.get("refdomain") != "py":
        return None
    public_target = _public_name(node["reftarget"])
    if public_target is None:
        return None
    domain: Any = env.get_domain("py")
    return domain.resolve_xref(  # type: ignore[no-any-return]
        env, node["refdoc"], app.builder, node["reftype"], public_target, node, contnode
    )


def _inherited(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.TextElement
) -> nodes.Element | None:
    """Resolve ``:meth:`feed``` in a subclass's docstring to the base class that documents ``feed``.

    Sphinx looks a bare member name up in the class the docstring belongs to only, and a subclass's page
    does not repeat what it inherits. The member is looked up along the class's real MRO, so only a member
    the class has resolves.
    """
    target, module_name, class_name = node["reftarget"], node.get("py:module"), node.get("py:class")
    if node.get("refdomain") != "py" or "." in target or not (module_name and class_name):
        return None
    try:
        cls = getattr(importlib.import_module(module_name), class_name.split(".")[0])
    except (ImportError, AttributeError):
        return None
    domain: Any = env.get_domain("py")
    for base in getattr(cls, "__mro__", ())[1:]:
        if base.__module__.partition(".")[0] != "streamvae" or not hasattr(base, target):
            continue
        base_name = _public_name(f"{base.__module__}.{base.__qualname__}") or (
            f"{base.__module__}.{base.__qualname__}"
        )
        found = domain.resolve_xref(
            env, node["refdoc"], app.builder, node["reftype"], f"{base_name}.{target}", node, contnode
        )
        if found is not None:
            return found  # type: ignore[no-any-return]
    return None


def _private_alias(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.TextElement
) -> nodes.Element | None:
    """A private type alias in an annotation (``ValueRange``, ``PixelFormat``) shows as what it stands for.

    A reader has no page for a private alias, so its value is spelled out in its place: ``ValueRange`` reads
    ``tuple[float, float] | PerChannelRange``. Only a name that is a type alias at the top of a streamvae
    module counts; a class or a typo stays unresolved, and fails.
    """
    target = node["reftarget"]
    if node.get("refdomain") != "py" or node.get("reftype") != "class" or "." in target:
        return None
    for module_name in sorted(sys.modules):
        if not module_name.startswith("streamvae."):
            continue
        module = sys.modules[module_name]
        value = getattr(module, target, None)
        if isinstance(value, str) and getattr(module, "__annotations__", {}).get(target) == "TypeAlias":
            return nodes.Text(value)  # ValueRange: TypeAlias = "tuple[float, float] | PerChannelRange"
        if value is not None and getattr(value, "__module__", None) in ("typing", "types", "numpy"):
            return nodes.Text(sphinx.util.typing.stringify_annotation(value, "smart").replace("~", ""))
    return None


def _missing_reference(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.TextElement
) -> nodes.Element | None:
    return (
        _resolve_private_homes(app, env, node, contnode)
        or _inherited(app, env, node, contnode)
        or _private_alias(app, env, node, contnode)
    )


def _public_sources(app: Sphinx) -> None:
    """Give each public module's source analysis the ``#:`` comments and source order of what it re-exports.

    autodoc reads a member's ``#:`` doc comment and its place in the source (``bysource``) from the module
    named by the object's ``__module__``: ``streamvae`` for ``@public`` objects, ``streamvae.testing`` for a
    re-exported constant. Their source is a private module. So each public module's analysis is completed,
    once, with the entries of each name it exports from its private home.
    """
    for public_module in _PUBLIC_MODULES:
        module = importlib.import_module(public_module)
        merged = ModuleAnalyzer.for_module(public_module)
        merged.analyze()
        for name in module.__all__:
            obj = getattr(module, name)
            # every error is defined in streamvae._errors, whichever public module exports it
            homes = [m for m in sys.modules if m.startswith(f"{public_module}._")] + ["streamvae._errors"]
            for home_name in homes:
                if getattr(sys.modules[home_name], name, None) is not obj:
                    continue
                home = ModuleAnalyzer.for_module(home_name)
                home.analyze()
                qualname = getattr(obj, "__qualname__", name) if isinstance(obj, type) else name
                if qualname not in home.tagorder:
                    continue  # imported there, defined elsewhere
                for (scope, attribute), doc in home.attr_docs.items():
                    ours = scope == qualname or scope.startswith(f"{qualname}.")
                    if ours or (scope, attribute) == ("", name):
                        merged.attr_docs.setdefault((scope, attribute), doc)
                for tag, order in home.tagorder.items():
                    if tag == qualname or tag.startswith(f"{qualname}."):
                        merged.tagorder.setdefault(tag, order)


def _data_doc(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A public constant without a ``#:`` doc comment is a warning (so a failure), never shown with the
    docstring of its value's type (``dict``'s, ``int``'s), which is what autodoc falls back to."""
    if what == "data" and "\n".join(lines).strip() == (sphinx.util.inspect.getdoc(type(obj)) or "").strip():
        lines[:] = []
        logger.warning("%s has no doc comment (#: above it, where it is defined)", name, location=name)


#: objects users get from streamvae and never build: their constructors take streamvae's private parts
_MADE_BY_STREAMVAE = {"streamvae.MP4ByteStream", "streamvae.ChunkLease"}


def _signature(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, signature: str | None, annotation: str | None
) -> tuple[str | None, str | None] | None:
    """No constructor for what users never build; a dataclass field's default_factory shows as ``...``
    (its repr ``<factory>`` is no Python: Sphinx could not parse the signature, and would show plain text)."""
    if name in _MADE_BY_STREAMVAE:
        return "", None
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), annotation
    return None


def _every_public_name_documented(app: Sphinx, env: BuildEnvironment) -> None:
    """Each name in a public module's ``__all__`` has its entry in the reference (``reference/*.md``)."""
    documented = env.get_domain("py").objects  # type: ignore[attr-defined]
    for public_module in _PUBLIC_MODULES:
        for name in importlib.import_module(public_module).__all__:
            if f"{public_module}.{name}" not in documented:
                logger.warning(
                    "%s.%s is public but not in the reference: add it to docs/reference/%s.md",
                    public_module,
                    name,
                    public_module,
                )


def setup(app: Sphinx) -> None:
    app.connect("env-check-consistency", _every_public_name_documented)
    app.connect("builder-inited", _public_sources)
    app.connect("missing-reference", _missing_reference)
    app.connect("autodoc-process-docstring", _data_doc)
    app.connect("autodoc-process-signature", _signature)
