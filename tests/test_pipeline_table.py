"""docs/pipelines.md: every video pipeline of the installed diffusers (standard and modular) with streamvae's
verdict — supported and exact (tested on a tiny seeded instance, named) or refused (and why) — made by this
test. ``STREAMVAE_WRITE_DOCS=1 pytest tests/test_pipeline_table.py`` rewrites the file."""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamvae.models import supported_classes
from streamvae.pipelines._plans import REFUSED, describe, first_byte, pipeline_key, plans
from tests.pipelines import BUILDERS, CORE

DOC = Path(__file__).resolve().parents[1] / "docs" / "pipelines.md"
#: the video VAE classes of diffusers' video pipelines (FACTS.md; SANA-Video's AutoencoderDC is an image VAE,
#: and the image pipelines that use it are not video ones); a pipeline with none of them, and no
#: ``num_frames``, is not a video pipeline
VIDEO_VAES = (
    "AutoencoderKLWan",
    "AutoencoderKLHunyuanVideo",
    "AutoencoderKLHunyuanVideo15",
    "AutoencoderKLLTXVideo",
    "AutoencoderKLLTX2Video",
    "AutoencoderKLCogVideoX",
    "AutoencoderKLCosmos",
    "AutoencoderKLMochi",
    "AutoencoderKLAllegro",
    "AutoencoderKLMagvit",
    "AutoencoderKLTemporalDecoder",
    "AutoencoderKLMiniMaxH3",
    "AutoencoderKLKVAEVideo",
    "Kandinsky6SRVAE",
)
#: the tests that check a supported pipeline's frames and sound against ``pipe()``'s
TESTS = {
    name: "tests/test_generate.py" if name in CORE else "tests/test_generate_every.py" for name in BUILDERS
}


@dataclass(frozen=True)
class Row:
    name: str  # the class (a modular pipeline: its blocks class)
    kind: str  # "standard" or "modular"
    vae: str
    verdict: str  # "exact" or "refused"
    why: str
    first_byte: str = "—"  # when the first byte can leave (an exact row)


def _vae_of_standard(cls: type) -> str:
    annotation = inspect.signature(cls.__init__).parameters.get("vae")
    if annotation is None:
        return "—"
    hint = annotation.annotation
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    names = [part.rsplit(".", 1)[-1] for part in text.replace("|", " ").split()]
    return " or ".join(name for name in names if name.startswith("Autoencoder") or name in VIDEO_VAES) or "—"


@functools.cache
def video_pipelines() -> list[tuple[str, str, str]]:
    """(name, kind, VAE classes) of every video pipeline class of the installed diffusers."""
    import diffusers
    import diffusers.modular_pipelines as modular

    found: list[tuple[str, str, str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(dir(diffusers)):
            if not name.endswith("Pipeline"):
                continue
            cls = getattr(diffusers, name)
            vae = _vae_of_standard(cls)
            takes_frames = "num_frames" in inspect.signature(cls.__call__).parameters
            if takes_frames or any(video in vae.split(" or ") for video in VIDEO_VAES):
                found.append((name, "standard", vae))
        for name in sorted(dir(modular)):
            cls = getattr(modular, name)
            if not (name.endswith("Blocks") and isinstance(cls, type) and hasattr(cls, "block_classes")):
                continue
            try:
                specs = cls().expected_components
            except Exception:
                continue
            vaes = [getattr(spec.type_hint, "__name__", "") for spec in specs if spec.name == "vae"]
            if any(vae in VIDEO_VAES for vae in vaes):
                found.append((name, "modular", " or ".join(vaes)))
    return found


@functools.cache
def builders_by_plan() -> dict[str, list[str]]:
    """Plan name → the builders whose pipelines it is tested on."""
    names: dict[str, list[str]] = {}
    for builder_name, builder in BUILDERS.items():
        pipe, _ = builder()
        names.setdefault(pipeline_key(pipe), []).append(builder_name)
    return names


def _tested_on(builder: str) -> str:
    """A builder's name, the module that defines it and the test that runs it."""
    module = BUILDERS[builder].__module__.replace(".", "/")
    return f"`{builder}` ({module}.py, by {TESTS[builder]})"


#: the verdict of a video pipeline streamvae has neither a plan nor a reason for: one a newer diffusers added
UNCHECKED = (
    "not yet checked frame for frame on a tiny seeded instance: refused rather than risk a short video"
)


def rows() -> list[Row]:
    tested = builders_by_plan()
    decoded = set(supported_classes())
    table: list[Row] = []
    for name, kind, vae in video_pipelines():
        plan = plans().get(name)
        if plan is not None:
            where = ", ".join(_tested_on(builder) for builder in sorted(tested.get(name, [])))
            why = f"{describe(plan)}; tested on {where}"
            table.append(Row(name, kind, vae, "exact", why, first_byte(plan)))
        elif name in REFUSED:
            table.append(Row(name, kind, vae, "refused", REFUSED[name]))
        elif not any(part in decoded for part in vae.split(" or ")):
            table.append(Row(name, kind, vae, "refused", f"its VAE ({vae}) is not one streamvae decodes"))
        else:
            table.append(Row(name, kind, vae, "refused", UNCHECKED))
    return table


def render(table: list[Row]) -> str:
    exact = sum(row.verdict == "exact" for row in table)
    lines = [
        "# diffusers video pipelines and streamvae",
        "",
        "Made by `tests/test_pipeline_table.py` from the installed diffusers (0.42.1): every video",
        "pipeline class (standard, and modular by its blocks class) with what",
        "`streamvae.pipelines.generate_mp4` and `stream_generation` do with it. *exact*: every frame",
        '`pipe(output_type="np")` returns, and its sound, checked on a tiny seeded instance by the named',
        "test. *refused*: a TypeError before any denoising step, saying why — never a short or silent video.",
        "*first byte*: when the first bytes of an exact row's MP4s can leave `stream_generation`, as far as",
        "the pipeline allows (a pipeline that changes earlier frames later holds them until they are final).",
        "",
        f"{exact} of {len(table)} are exact.",
        "",
        "| pipeline | kind | VAE | verdict | why | first byte |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| `{r.name}` | {r.kind} | {r.vae} | {r.verdict} | {r.why} | {r.first_byte} |" for r in table]
    return "\n".join(lines) + "\n"


def test_every_plan_is_a_diffusers_video_pipeline_tested_on_a_tiny_instance() -> None:
    listed = {name for name, _, _ in video_pipelines()}
    tested = builders_by_plan()
    for name in plans():
        assert name in listed, name
        assert tested.get(name), f"{name} has a plan but no tiny seeded builder tests it"


def test_every_video_pipeline_is_exact_or_refused_for_a_reason() -> None:
    """A pipeline class a newer diffusers adds has no plan and no reason: this fails until one is checked."""
    unchecked = [row.name for row in rows() if row.why == UNCHECKED]
    assert not unchecked, f"not yet checked: {', '.join(unchecked)} (give each a builder and a plan)"


def test_docs_pipelines_md_is_the_table_this_test_makes() -> None:
    text = render(rows())
    if os.environ.get("STREAMVAE_WRITE_DOCS") == "1":
        DOC.write_text(text)
    assert DOC.read_text() == text, "docs/pipelines.md is stale: rerun with STREAMVAE_WRITE_DOCS=1"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_pipeline_has_no_plan(name: str) -> None:
    assert name not in plans()
