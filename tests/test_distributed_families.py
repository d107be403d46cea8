"""Spatial shards of the families beyond Wan (HunyuanVideo, LTX-Video, LTX-2, CogVideoX, Mochi, EasyAnimate's
Magvit) over gloo.

Every rank decodes through ``sharded_decoder(vae, shard=...)``: its strip with the family's own walk and
the hooks of ``streamvae.distributed._hooks`` on the shared decoder, the chunks gathered on the output rank
(rank 0); the reference is ``vae.decode`` in this process, one torch thread like the ranks. Small
temporal windows (HunyuanVideo, LTX) and latent batches (CogVideoX) are walked, so the halos also cross
window and batch boundaries. All scenarios of a group run in one start of its processes: importing torch
and diffusers costs ~8 s a process. (``streamvae decode --shard`` of a CogVideoX under torchrun is tested
with the other torchrun launches, in tests/test_distributed.py.)

What is asserted is what was measured on this repository's 2-core AVX2 CPU (docs/_families_exactness.md):
``torch.equal`` where it held, else the measured max |Δ| and quantized levels under a bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from diffusers.models.attention_processor import Attention
from torch import Tensor

from streamvae import quantize_chunk
from streamvae.distributed import ShardedDecoder, sharded_decoder
from streamvae.distributed._hooks import check_shardable, install_hooks
from streamvae.distributed._layout import AXIS_DIM
from tests._ranks import spawn_ranks
from tests._vaes import (
    tiny_allegro,
    tiny_cogvideox,
    tiny_cosmos,
    tiny_hunyuan_video,
    tiny_kvae,
    tiny_ltx2_video,
    tiny_ltx_video,
    tiny_magvit,
    tiny_minimax_h3,
    tiny_mochi,
    tiny_stable_video,
)

GLOO_TIMEOUT = timedelta(seconds=60)  # a rank stuck in a collective raises after this
JOIN_TIMEOUT = 240.0  # a group that has not finished by then hung: the test fails

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------------- tiny VAEs


def family(name: str) -> tuple[Any, dict[str, Any]]:
    """A fresh tiny VAE of ``name`` and the keywords its adapter (and ``vae.decode``) takes."""
    if name == "hunyuan":
        return tiny_hunyuan_video(), {}
    if name == "ltx":
        return tiny_ltx_video(), {}
    if name == "ltx_temb":
        return tiny_ltx_video(timestep_conditioning=True), {"temb": torch.tensor([0.05])}
    if name == "ltx2":
        return tiny_ltx2_video(), {}
    if name == "mochi":
        return tiny_mochi(), {}
    if name == "magvit":
        return tiny_magvit(), {}
    assert name == "cogvideox"
    return tiny_cogvideox(), {}


@dataclass(frozen=True)
class Scenario:
    """One sharded decode of a family's tiny VAE, and the exactness measured for it."""

    family: str
    frames: int
    height: int
    width: int
    shard: str
    exact: bool = False  # measured torch.equal to vae.decode
    max_delta: float = 0.0  # bound on max |Δ| where not exact (the measured figure is in the comment)

    @property
    def name(self) -> str:
        return f"{self.family}_{self.frames}x{self.height}x{self.width}_{self.shard}"

    def latent(self, vae: Any) -> Tensor:
        channels = int(vae.config.latent_channels)
        generator = torch.Generator().manual_seed(0)
        return torch.randn(1, channels, self.frames, self.height, self.width, generator=generator)


TWO_RANKS = [
    Scenario("hunyuan", 7, 5, 6, "height", max_delta=2e-5),  # measured 5.25e-6, 1 level; 3 windows
    Scenario("hunyuan", 7, 5, 6, "width", max_delta=2e-5),  # measured 5.25e-6, 1 level
    Scenario("cogvideox", 7, 5, 6, "height", max_delta=2e-5),  # measured 4.29e-6, 1 level; 3 batches
    Scenario("cogvideox", 7, 5, 6, "width", max_delta=2e-5),  # measured 4.29e-6, 1 level
    Scenario("ltx", 7, 8, 8, "height", exact=True),  # 3 windows
    Scenario("ltx", 7, 8, 8, "width", exact=True),
    Scenario("ltx", 7, 5, 6, "height", max_delta=1e-5),  # measured 1.55e-6, 1 level
    Scenario("ltx_temb", 7, 8, 8, "height", exact=True),
    Scenario("ltx2", 7, 8, 8, "width", exact=True),
    Scenario("ltx2", 7, 5, 6, "height", max_delta=1e-5),  # measured 1.58e-6, 1 level
    Scenario("mochi", 3, 8, 8, "height", max_delta=1e-5),  # measured 9.39e-7: the whole clip, one call
    Scenario("mochi", 3, 5, 6, "width", max_delta=1e-5),
    Scenario("magvit", 5, 8, 8, "height", max_delta=5e-5),  # measured 1.29e-5: one framewise call a step
    Scenario("magvit", 5, 5, 6, "width", max_delta=5e-5),
    # auto: the axis chosen from the latent's size (height here; the bounds of the fixed axes above)
    Scenario("hunyuan", 7, 8, 8, "auto", max_delta=2e-5),
    Scenario("cogvideox", 7, 8, 8, "auto", max_delta=2e-5),
    Scenario("ltx_temb", 7, 8, 8, "auto", max_delta=1e-5),
]
THREE_RANKS = [  # 2 latent rows (columns): 1-row strips, and rank 2 decodes a copy
    Scenario("hunyuan", 4, 2, 8, "height", max_delta=2e-5),  # measured 4.05e-6, 1 level; 2 windows
    Scenario("cogvideox", 4, 8, 2, "width", max_delta=2e-5),  # measured 1.67e-6, 1 level; 2 batches
    Scenario("ltx", 4, 2, 8, "height", max_delta=1e-5),  # measured 1.22e-6, 0 levels
    Scenario("ltx_temb", 7, 8, 8, "height", exact=True),  # strips of 3, 3, 2 rows
]
GROUPS = {2: TWO_RANKS, 3: THREE_RANKS}


# ------------------------------------------------------------------------------------------- in each rank


@dataclass
class RankResult:
    """What one rank saw in one scenario: the chunks it published (rank 0 only), its counters."""

    chunks: Tensor | None = None
    chunk_count: int = 0
    adapter: str = ""  # the class sharded_decoder gave
    stats: dict[str, Any] = field(default_factory=dict)


def _decode_sharded(scenario: Scenario, rank: int, world: int) -> RankResult:
    vae, kwargs = family(scenario.family)
    z = scenario.latent(vae)
    decoder = sharded_decoder(vae, shard=scenario.shard, **kwargs)  # type: ignore[arg-type]
    chunks: list[Tensor] = []
    decoder.decode_with_chunks(z, on_chunk=lambda chunk: chunks.append(chunk.clone()))
    joined = torch.cat(chunks, dim=2) if chunks else None
    stats = dataclasses.asdict(decoder.stats)
    return RankResult(chunks=joined, chunk_count=len(chunks), stats=stats, adapter=type(decoder).__name__)


def _rank_main(rank: int, world: int, folder: str, scenarios: list[Scenario]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world, timeout=GLOO_TIMEOUT
    )
    try:
        with torch.no_grad():
            results = {s.name: _decode_sharded(s, rank, world) for s in scenarios}
        torch.save(results, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_group(world: int, folder: Path) -> list[dict[str, RankResult]]:
    """Start ``world`` ranks that run the group's scenarios; fail the test if any rank hangs or dies."""
    spawn_ranks(world, _rank_main, (world, str(folder), GROUPS[world]), deadline_s=JOIN_TIMEOUT)
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, RankResult]]:
    return run_group(2, tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, RankResult]]:
    return run_group(3, tmp_path_factory.mktemp("three_ranks"))


def reference(scenario: Scenario) -> Tensor:
    """diffusers' single-process ``vae.decode`` of the scenario's latent (one torch thread, as the ranks)."""
    vae, kwargs = family(scenario.family)
    z = scenario.latent(vae)
    with torch.no_grad():
        decoded: Tensor = vae.decode(z, *kwargs.values()).sample
    return decoded


# ------------------------------------------------------------------------------------------------ tests

CASES = [(world, s) for world, group in GROUPS.items() for s in group]


@pytest.mark.parametrize(("world", "scenario"), CASES, ids=[f"{w}_ranks_{s.name}" for w, s in CASES])
def test_joined_strips_equal_the_single_process_decode(
    request: pytest.FixtureRequest, world: int, scenario: Scenario
) -> None:
    ranks: list[dict[str, RankResult]] = request.getfixturevalue("two_ranks" if world == 2 else "three_ranks")
    got = ranks[0][scenario.name].chunks
    expected = reference(scenario)
    assert got is not None and got.shape == expected.shape
    delta = (got - expected).abs().max().item()
    if scenario.exact:
        assert torch.equal(got, expected), f"expected bit-exact, max |Δ| {delta:.3g}"
        return
    assert delta <= scenario.max_delta, f"max |Δ| {delta:.3g}"
    levels = quantize_chunk(got, (-1.0, 1.0)).int() - quantize_chunk(expected, (-1.0, 1.0)).int()
    assert levels.abs().max().item() <= 1


@pytest.mark.parametrize(("world", "scenario"), CASES, ids=[f"{w}_ranks_{s.name}" for w, s in CASES])
def test_every_rank_makes_the_same_collectives(
    request: pytest.FixtureRequest, world: int, scenario: Scenario
) -> None:
    ranks: list[dict[str, RankResult]] = request.getfixturevalue("two_ranks" if world == 2 else "three_ranks")
    seen = [r[scenario.name] for r in ranks]
    assert all(r.stats == seen[0].stats for r in seen)
    assert {r.adapter for r in seen} == {ShardedDecoder.__name__}
    assert seen[0].chunk_count > 1  # the windows (batches) were walked, not one call
    assert all(r.chunk_count == 0 and r.chunks is None for r in seen[1:])  # only the output rank publishes
    assert all(r.stats["steps"] == seen[0].chunk_count for r in seen)
    group_norms = scenario.family in ("hunyuan", "cogvideox", "mochi", "magvit")
    assert (seen[0].stats["norm_reductions"] > 0) == group_norms
    assert (seen[0].stats["attention_gathers"] > 0) == (scenario.family == "hunyuan")


# ------------------------------------------------------------------------------------- in this process


@pytest.mark.parametrize("name", ["hunyuan", "ltx_temb", "ltx2", "cogvideox", "mochi", "magvit"])
def test_a_plain_decode_is_unaffected_by_the_hooks(name: str) -> None:
    vae, kwargs = family(name)
    z = Scenario(name, 4, 3, 5, "height").latent(vae)
    with torch.no_grad():
        before = vae.decode(z, *kwargs.values()).sample
        install_hooks(vae.decoder)
        after = vae.decode(z, *kwargs.values()).sample
    assert torch.equal(before, after)


def test_injected_noise_is_refused_naming_the_layer() -> None:
    vae = tiny_ltx_video(decoder_inject_noise=(True, False, False, False, False))
    with pytest.raises(ValueError, match=r"'up_blocks\.3\.resnets\.0'.*decoder_inject_noise"):
        check_shardable(vae.decoder, AXIS_DIM["height"])


def test_a_strided_convolution_is_refused_naming_the_layer() -> None:
    vae = tiny_cogvideox()
    conv = vae.decoder.conv_out.conv
    conv.stride = (1, 2, 2)
    with pytest.raises(ValueError, match=r"'conv_out\.conv'.*stride-1 'same'"):
        check_shardable(vae.decoder, AXIS_DIM["width"])


def test_attention_outside_a_whole_frame_block_is_refused() -> None:
    vae = tiny_hunyuan_video()
    vae.decoder.extra = Attention(8, heads=1, dim_head=8)  # not inside the mid-block
    with pytest.raises(ValueError, match=r"'extra'.*attention mixes the whole frame"):
        check_shardable(vae.decoder, AXIS_DIM["height"])


@pytest.mark.parametrize(
    ("factory", "layer", "reason"),
    [
        (tiny_minimax_h3, "transformer_blocks.0.attn", "attention mixes the whole frame"),
        (tiny_allegro, "mid_block.attentions.0", "attention mixes the whole frame"),
        (tiny_stable_video, "mid_block.attentions.0", "attention mixes the whole frame"),
        (tiny_cosmos, "conv_in.conv_s", "stride-1 'same'"),
        (tiny_kvae, "conv_in.conv", "stride-1 'same'"),
    ],
)
def test_families_whose_layers_do_not_shard_are_refused_at_construction_naming_the_layer(
    factory: Any, layer: str, reason: str
) -> None:
    vae = factory()
    with pytest.raises(ValueError, match=rf"'{layer}'.*{reason}"):
        check_shardable(vae.decoder, AXIS_DIM["height"])
