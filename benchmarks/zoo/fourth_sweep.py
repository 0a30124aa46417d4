"""The fourth sweep's architectures (2026-11-27), on demand with the wider set.

Families the earlier sets did not hold: speech and detection transformers
(Whisper, DETR), permutation and funnel-free encoders (XLNet, ConvBERT, FNet's
Fourier mixing, CANINE's characters, Perceiver's latents), Longformer's
sliding-window attention, RWKV's recurrence, Mamba-2, and timm's hybrids
(PVT v2, XCiT, BoTNet, MaxViT, Hiera, EfficientViT, Sequencer's LSTMs).
Two were wrong or slow under auto and are fixed: Longformer's ONNX Runtime
region read ``as_strided`` windows of a transposed tensor in the wrong order
(hidden states up to 4e-3 off; ``onnx_ops.as_strided_storage``), and RWKV's
3595 small ops stayed on ONNX Runtime at 2.5x plain inductor's time
(``inductor_bar.many_small_ops``). Same rules as the zoo: config objects,
random weights, nothing downloaded.
"""

from __future__ import annotations

from functools import partial

import torch

from .models import (
    _SEQ2SEQ,
    _SMALL_VISION,
    _TEXT_FFN,
    IMAGE,
    VOCAB,
    ZooModel,
    _hf,
    _image,
    _timm,
    _tokens,
    _torchvision_without_its_kernels,
)


class _Whisper(torch.nn.Module):
    """Whisper called with log-mel features and decoder token ids by name."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features, decoder_input_ids):
        return self.model(input_features=input_features, decoder_input_ids=decoder_input_ids)


def _whisper() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    _torchvision_without_its_kernels()
    import transformers

    config = transformers.WhisperConfig(
        **{k: v for k, v in _SEQ2SEQ.items() if k != "max_position_embeddings"},
        num_mel_bins=80,
        max_source_positions=100,
        max_target_positions=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2, 80, 200, generator=g)  # 2 s of audio at Whisper's 100 frames/s
    return _Whisper(transformers.WhisperModel(config)), (
        features,
        torch.randint(0, VOCAB, (2, 16), generator=g),
    )


def _detr() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """DETR on transformers' own ResNet backbone (no timm weights to fetch)."""
    _torchvision_without_its_kernels()
    import transformers

    backbone = transformers.ResNetConfig(
        hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], out_features=["stage4"]
    )
    config = transformers.DetrConfig(
        use_timm_backbone=False,
        backbone_config=backbone,
        use_pretrained_backbone=False,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_queries=10,
    )
    torch.manual_seed(0)
    return transformers.DetrModel(config), _image(size=128)


def _latents() -> tuple[torch.Tensor]:
    return (torch.randn(2, 64, 128, generator=torch.Generator().manual_seed(0)),)


FOURTH_SWEEP: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel("hf_whisper", "transformers", _whisper),
        ZooModel("hf_detr", "transformers", _detr),
        ZooModel(
            "hf_clip_text",
            "transformers",
            _hf(
                "CLIPTextModel",
                "CLIPTextConfig",
                _tokens,
                **{**_TEXT_FFN, "max_position_embeddings": 64},
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            ),
        ),
        ZooModel(
            "hf_xlnet",
            "transformers",
            _hf(
                "XLNetModel",
                "XLNetConfig",
                _tokens,
                vocab_size=VOCAB,
                d_model=128,
                n_layer=2,
                n_head=4,
                d_inner=256,
            ),
        ),
        ZooModel(
            "hf_convbert",
            "transformers",
            _hf("ConvBertModel", "ConvBertConfig", _tokens, **_TEXT_FFN, embedding_size=128),
        ),
        ZooModel(
            "hf_fnet",
            "transformers",
            _hf(
                "FNetModel",
                "FNetConfig",
                _tokens,
                vocab_size=VOCAB,
                hidden_size=128,
                num_hidden_layers=2,
                intermediate_size=256,
                max_position_embeddings=128,
            ),
        ),
        ZooModel(
            "hf_canine",
            "transformers",
            _hf(
                "CanineModel",
                "CanineConfig",
                _tokens,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=256,
                downsampling_rate=4,
                num_hash_buckets=1024,
                local_transformer_stride=16,
            ),
        ),
        ZooModel(
            "hf_longformer",  # sliding-window attention: as_strided windows of transposed storage
            "transformers",
            _hf("LongformerModel", "LongformerConfig", _tokens, **_TEXT_FFN, attention_window=16),
        ),
        ZooModel(
            "hf_rwkv",  # a recurrence Dynamo unrolls into thousands of small ops
            "transformers",
            _hf(
                "RwkvModel",
                "RwkvConfig",
                partial(_tokens, seq=32),
                vocab_size=VOCAB,
                hidden_size=128,
                num_hidden_layers=2,
                attention_hidden_size=128,
                intermediate_size=256,
                context_length=128,
            ),
        ),
        ZooModel(
            "hf_mamba2",
            "transformers",
            _hf(
                "Mamba2Model",
                "Mamba2Config",
                _tokens,
                vocab_size=VOCAB,
                hidden_size=128,
                num_hidden_layers=2,
                num_heads=4,
                head_dim=64,
                n_groups=1,
                state_size=16,
                chunk_size=32,
            ),
        ),
        ZooModel(
            "hf_phi3", "transformers", _hf("Phi3Model", "Phi3Config", _tokens, **_TEXT_FFN, pad_token_id=0)
        ),
        ZooModel(
            "hf_pegasus",
            "transformers",
            _hf("PegasusModel", "PegasusConfig", lambda: _tokens(0), seq2seq=True, **_SEQ2SEQ),
        ),
        ZooModel(
            "hf_perceiver",
            "transformers",
            _hf(
                "PerceiverModel",
                "PerceiverConfig",
                _latents,
                num_latents=32,
                d_latents=128,
                d_model=128,
                num_blocks=1,
                num_self_attends_per_block=2,
                num_self_attention_heads=4,
                num_cross_attention_heads=4,
            ),
        ),
        ZooModel(
            "hf_siglip_vision",
            "transformers",
            _hf("SiglipVisionModel", "SiglipVisionConfig", _image, **_SMALL_VISION),
        ),
        ZooModel("timm_pvt_v2", "timm", _timm("pvt_v2_b0")),
        ZooModel("timm_xcit", "timm", _timm("xcit_nano_12_p16_224", img_size=IMAGE)),
        ZooModel("timm_botnet", "timm", _timm("botnet26t_256", img_size=IMAGE)),
        ZooModel(
            "timm_maxvit", "timm", _timm("maxvit_nano_rw_256", img_size=128, inputs=partial(_image, size=128))
        ),
        ZooModel("timm_hiera", "timm", _timm("hiera_tiny_224", img_size=IMAGE)),
        ZooModel("timm_efficientvit", "timm", _timm("efficientvit_b0")),
        ZooModel("timm_sequencer", "timm", _timm("sequencer2d_s", img_size=IMAGE)),
        ZooModel("timm_mobileone", "timm", _timm("mobileone_s0")),
        ZooModel("timm_tf_efficientnet", "timm", _timm("tf_efficientnet_b0")),
    )
}
