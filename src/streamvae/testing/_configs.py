"""Tiny VAE configs: real diffusers VAE classes small enough for tests, examples and smoke runs on a CPU."""

from __future__ import annotations

from typing import Any

__all__ = ["TINY_VAE_CONFIGS", "enable_small_tiling"]

#: Configs of tiny diffusers VAEs (the real classes; a few latent frames decode in a fraction of a second on
#: a CPU) for tests, examples and smoke runs: ``AutoencoderKLWan(**TINY_VAE_CONFIGS["wan22"])``.
TINY_VAE_CONFIGS: dict[str, dict[str, Any]] = {
    # Wan 2.1 layout (z_dim 16, 8× spatial); AutoencoderKLQwenImage takes the same config.
    "wan21": {"base_dim": 3, "z_dim": 16, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1},
    # Wan 2.2 layout (z_dim 48, residual, patch_size 2, 16× spatial).
    "wan22": {
        "base_dim": 4,
        "decoder_base_dim": 4,
        "z_dim": 48,
        "dim_mult": [1, 1, 1, 1],
        "num_res_blocks": 1,
        "is_residual": True,
        "in_channels": 12,
        "out_channels": 12,
        "patch_size": 2,
        "scale_factor_spatial": 16,
    },
    # MiniMax-H3 (AutoencoderKLMiniMaxH3): the released temporal geometry (clips of 5 + 2 latent frames,
    # clip_length 17, token_drop 3), 4× spatial, a one-layer ViT decoder.
    "minimax_h3": {
        "latent_channels": 4,
        "block_out_channels": [4, 4],
        "layers_per_block": 1,
        "spatial_downsample_factors": [2, 2],
        "temporal_downsample_factors": [2, 2],
        "norm_num_groups": 2,
        "decoder_num_layers": 1,
        "decoder_num_attention_heads": 2,
        "decoder_attention_head_dim": 8,
        "decoder_num_register_tokens": 1,
        "decoder_ffn_mult": 1,
        "latents_mean": [0.0] * 4,
        "latents_std": [1.0] * 4,
    },
    # Allegro (AutoencoderKLAllegro): two blocks of 4 channels, 4× temporal, 2× spatial. It decodes only in
    # tiles (vae.enable_tiling()), whose sizes vae.kernel / vae.stride are attributes, not config.
    "allegro": {
        "latent_channels": 4,
        "block_out_channels": [4, 4],
        "down_block_types": ["AllegroDownBlock3D", "AllegroDownBlock3D"],
        "up_block_types": ["AllegroUpBlock3D", "AllegroUpBlock3D"],
        "temporal_downsample_blocks": [True, True],
        "temporal_upsample_blocks": [True, True],
        "temporal_compression_ratio": 4,
        "layers_per_block": 1,
        "norm_num_groups": 2,
    },
    # KVAE (AutoencoderKLKVAEVideo): 4 latent channels, 4× temporal and spatial; its norms have 32 groups.
    "kvae": {"ch": 32, "ch_mult": [1, 1, 1], "num_res_blocks": 0, "z_channels": 4},
    # HunyuanVideo 1.5 (AutoencoderKLHunyuanVideo15): 4 latent channels, 4× temporal, 8× spatial.
    "hunyuan_video15": {
        "latent_channels": 4,
        "block_out_channels": (8, 8, 8, 8),
        "layers_per_block": 1,
        "spatial_compression_ratio": 8,
        "temporal_compression_ratio": 4,
    },
    # Mochi (AutoencoderKLMochi): 12 latent channels, 6× temporal, 8× spatial; GroupNorm of 32 groups.
    "mochi": {
        "encoder_block_out_channels": (32, 32, 32, 32),
        "decoder_block_out_channels": (32, 32, 32, 32),
        "layers_per_block": (1, 1, 1, 1, 1),
    },
    # Cosmos (AutoencoderKLCosmos): 4 latent channels, 8× temporal and spatial.
    "cosmos": {
        "latent_channels": 4,
        "encoder_block_out_channels": (8, 8, 8, 8),
        "decode_block_out_channels": (8, 8, 8, 8),
        "num_layers": 1,
    },
    # EasyAnimate (AutoencoderKLMagvit): 4 latent channels, 4× temporal, 8× spatial.
    "magvit": {
        "latent_channels": 4,
        "block_out_channels": [8, 8, 8, 8],
        "layers_per_block": 1,
        "norm_num_groups": 4,
    },
    # Stable Video Diffusion (AutoencoderKLTemporalDecoder): 4 latent channels, a frame per latent frame,
    # 2× spatial; its decoder's GroupNorm has 32 groups.
    "stable_video": {
        "block_out_channels": [32, 32],
        "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
        "layers_per_block": 1,
        "latent_channels": 4,
    },
}


def enable_small_tiling(vae: Any) -> None:
    """Spatial tiles of 4×4 latents every 3 latents, so a small latent tiles (6×7 latents: 2×3 tiles)."""
    ratio = vae.spatial_compression_ratio
    vae.enable_tiling(
        tile_sample_min_height=4 * ratio,
        tile_sample_min_width=4 * ratio,
        tile_sample_stride_height=3 * ratio,
        tile_sample_stride_width=3 * ratio,
    )
