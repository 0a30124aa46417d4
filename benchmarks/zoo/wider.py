"""More architectures, run on demand (``--models wider``), beside the zoo's own.

The zoo's list is what every run measures; these check that what it found
holds on architectures nobody tuned for: other encoders and decoders, vision
transformers and CNNs with many small modules, and three models at the sizes
of issue 13's table (BERT and GPT-2 at 4x128 tokens, resnet18 at 8x224x224),
where a call takes tens of milliseconds instead of the zoo's hundreds of
microseconds. Since 2026-11-26 also audio, segmentation and small decoder
families (wav2vec2, SegFormer, Gemma, Phi, BLOOM's ALiBi, ...) and the code
patterns of ``patterns.py`` (recurrent layers, a U-Net, top-k and scatter,
masked attention, ...), since its second sweep Qwen3, Gemma 2, ModernBERT,
Mamba, GPT-BigCode and EVA-02, and the third sweep's 18 and two mixtures of
experts, OLMoE and Qwen2-MoE (``third_sweep.py``), and the fourth sweep's 23
(``fourth_sweep.py``: Whisper, DETR, Longformer, RWKV, ...), and the fifth
sweep's 36 (``fifth_sweep.py``: Gemma 3, DeepSeek-V3, Jamba, Funnel, LED, ...).
Same rules: config objects, random weights, nothing downloaded.
"""

from __future__ import annotations

from functools import partial

from .fifth_sweep import FIFTH_SWEEP
from .fourth_sweep import FOURTH_SWEEP
from .layer_patterns import LAYER_PATTERNS
from .models import (
    _SMALL_SWIN,
    _SMALL_VISION,
    _TEXT_FFN,
    IMAGE,
    VOCAB,
    ZOO,
    ZooModel,
    _audio,
    _hf,
    _image,
    _timm,
    _tokens,
)
from .patterns import PATTERNS
from .third_sweep import THIRD_SWEEP

_VISION = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "image_size": IMAGE,
    "patch_size": 16,
}

_TWO_STAGES = {"hidden_sizes": [16, 32], "depths": [1, 1]}


_FALCON = {"vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}

WIDER: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "hf_electra",
            "transformers",
            _hf("ElectraModel", "ElectraConfig", _tokens, **_TEXT_FFN, embedding_size=64),
        ),
        ZooModel(
            "hf_deberta_v2", "transformers", _hf("DebertaV2Model", "DebertaV2Config", _tokens, **_TEXT_FFN)
        ),
        ZooModel(
            "hf_mistral",
            "transformers",
            _hf("MistralModel", "MistralConfig", _tokens, **_TEXT_FFN, num_key_value_heads=2),
        ),
        ZooModel(
            "hf_qwen2",
            "transformers",
            _hf("Qwen2Model", "Qwen2Config", _tokens, **_TEXT_FFN, num_key_value_heads=2),
        ),
        ZooModel(
            "hf_opt",
            "transformers",
            _hf(
                "OPTModel",
                "OPTConfig",
                _tokens,
                vocab_size=VOCAB,
                hidden_size=128,
                num_hidden_layers=2,
                ffn_dim=256,
                num_attention_heads=4,
                word_embed_proj_dim=128,
                max_position_embeddings=128,
            ),
        ),
        ZooModel("hf_deit", "transformers", _hf("DeiTModel", "DeiTConfig", _image, **_VISION)),
        ZooModel(
            "hf_swin",
            "transformers",
            _hf("SwinModel", "SwinConfig", _image, **_SMALL_SWIN),
        ),
        ZooModel(
            "hf_clip_vision", "transformers", _hf("CLIPVisionModel", "CLIPVisionConfig", _image, **_VISION)
        ),
        ZooModel("timm_densenet121", "timm", _timm("densenet121")),
        ZooModel("timm_ghostnet", "timm", _timm("ghostnet_100")),
        ZooModel("timm_mobilevit", "timm", _timm("mobilevit_xxs")),
        ZooModel("timm_deit_tiny", "timm", _timm("deit_tiny_patch16_224", img_size=IMAGE)),
        # Weight standardisation (ScaledStdConv2d): batch norm on the weights' own statistics.
        ZooModel("timm_nfnet_l0", "timm", _timm("nfnet_l0")),
        ZooModel("hf_falcon", "transformers", _hf("FalconModel", "FalconConfig", _tokens, **_FALCON)),
        ZooModel(
            "hf_bert_4x128",
            "transformers",
            _hf(
                "BertModel",
                "BertConfig",
                partial(_tokens, batch=4, seq=128),
                vocab_size=VOCAB,
                hidden_size=256,
                num_hidden_layers=4,
                num_attention_heads=4,
                intermediate_size=1024,
            ),
        ),
        ZooModel(
            "hf_gpt2_4x128",
            "transformers",
            _hf(
                "GPT2Model",
                "GPT2Config",
                partial(_tokens, batch=4, seq=128),
                vocab_size=VOCAB,
                n_embd=256,
                n_layer=4,
                n_head=4,
                n_positions=128,
            ),
        ),
        ZooModel("timm_resnet18_8x224", "timm", _timm("resnet18", inputs=partial(_image, batch=8, size=224))),
        # Added 2026-11-26, after a sweep of architectures nobody had tried (benchmarks/README.md).
        ZooModel(
            "hf_wav2vec2",
            "transformers",
            _hf(
                "Wav2Vec2Model",
                "Wav2Vec2Config",
                _audio,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                conv_dim=(32, 32, 32),
                conv_stride=(5, 2, 2),
                conv_kernel=(10, 3, 3),
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4,
            ),
        ),
        ZooModel(
            "hf_segformer",
            "transformers",
            _hf(
                "SegformerModel",
                "SegformerConfig",
                _image,
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[4, 2],
                hidden_sizes=[16, 32],
                num_attention_heads=[1, 2],
                strides=[4, 2],
                patch_sizes=[7, 3],
                mlp_ratios=[2, 2],
            ),
        ),
        ZooModel("hf_dinov2", "transformers", _hf("Dinov2Model", "Dinov2Config", _image, **_SMALL_VISION)),
        ZooModel(
            "hf_beit",
            "transformers",
            _hf("BeitModel", "BeitConfig", _image, **_SMALL_VISION, use_relative_position_bias=True),
        ),
        ZooModel(
            "hf_convnextv2",
            "transformers",
            _hf("ConvNextV2Model", "ConvNextV2Config", _image, **_TWO_STAGES, num_stages=2),
        ),
        ZooModel(
            "hf_regnet",
            "transformers",
            _hf("RegNetModel", "RegNetConfig", _image, **_TWO_STAGES, groups_width=8, embedding_size=16),
        ),
        ZooModel(
            "hf_levit",
            "transformers",
            _hf(
                "LevitModel",
                "LevitConfig",
                _image,
                image_size=IMAGE,
                hidden_sizes=[32, 48, 64],
                num_attention_heads=[1, 2, 2],
                depths=[1, 1, 1],
                key_dim=[8, 8, 8],
            ),
        ),
        ZooModel(
            "hf_mobilevit",
            "transformers",
            _hf(
                "MobileViTModel",
                "MobileViTConfig",
                _image,
                image_size=IMAGE,
                hidden_sizes=[32, 48, 64],
                neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 96],
            ),
        ),
        ZooModel(
            "hf_gemma",
            "transformers",
            _hf("GemmaModel", "GemmaConfig", _tokens, **_TEXT_FFN, num_key_value_heads=1, head_dim=32),
        ),
        ZooModel("hf_phi", "transformers", _hf("PhiModel", "PhiConfig", _tokens, **_TEXT_FFN)),
        ZooModel("hf_gpt_neox", "transformers", _hf("GPTNeoXModel", "GPTNeoXConfig", _tokens, **_TEXT_FFN)),
        ZooModel(
            "hf_bloom",
            "transformers",
            _hf("BloomModel", "BloomConfig", _tokens, vocab_size=VOCAB, hidden_size=128, n_layer=2, n_head=4),
        ),
        ZooModel(
            "hf_xlm_roberta", "transformers", _hf("XLMRobertaModel", "XLMRobertaConfig", _tokens, **_TEXT_FFN)
        ),
        ZooModel("hf_mpnet", "transformers", _hf("MPNetModel", "MPNetConfig", _tokens, **_TEXT_FFN)),
        # 2026-11-26, second sweep: decoders of 2025, state-space and multi-query models.
        ZooModel(
            "hf_qwen3",
            "transformers",
            _hf("Qwen3Model", "Qwen3Config", _tokens, **_TEXT_FFN, num_key_value_heads=2, head_dim=32),
        ),
        ZooModel(
            "hf_gemma2",
            "transformers",
            _hf(
                "Gemma2Model",
                "Gemma2Config",
                _tokens,
                **_TEXT_FFN,
                num_key_value_heads=2,
                head_dim=32,
                sliding_window=16,
            ),
        ),
        ZooModel(
            "hf_modernbert",
            "transformers",
            _hf("ModernBertModel", "ModernBertConfig", _tokens, **_TEXT_FFN, pad_token_id=0, sep_token_id=2),
        ),
        ZooModel(
            "hf_mamba",  # transformers' reference scan: hundreds of small ops, few FLOPs
            "transformers",
            _hf(
                "MambaModel",
                "MambaConfig",
                _tokens,
                vocab_size=VOCAB,
                hidden_size=64,
                num_hidden_layers=2,
                state_size=8,
            ),
        ),
        ZooModel(
            "hf_gpt_bigcode",
            "transformers",
            _hf(
                "GPTBigCodeModel",
                "GPTBigCodeConfig",
                _tokens,
                vocab_size=VOCAB,
                n_embd=128,
                n_layer=2,
                n_head=4,
            ),
        ),
        ZooModel(
            "timm_eva02", "timm", _timm("eva02_tiny_patch14_224", partial(_image, size=112), img_size=112)
        ),
        ZooModel("timm_repvgg", "timm", _timm("repvgg_a0")),
        ZooModel("timm_inception_v3", "timm", _timm("inception_v3", inputs=partial(_image, size=96))),
        *(ZooModel(name, "pattern", build) for name, build in PATTERNS.items()),
        *(ZooModel(name, "pattern", build) for name, build in LAYER_PATTERNS.items()),
        *THIRD_SWEEP.values(),
        *FOURTH_SWEEP.values(),
        *FIFTH_SWEEP.values(),
    )
}

EVERY_MODEL: dict[str, ZooModel] = {**ZOO, **WIDER}


def model_names(spec: str) -> list[str]:
    """The models a ``--models`` value names: comma-separated names, where
    ``wider`` stands for this whole set. Unknown names raise ValueError."""
    names = [n for m in spec.split(",") if m for n in (WIDER if m == "wider" else (m,))]
    unknown = sorted(set(names) - set(EVERY_MODEL))
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; models: {list(EVERY_MODEL)}")
    return names
