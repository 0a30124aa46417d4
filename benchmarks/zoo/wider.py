"""More architectures, run on demand (``--models wider``), beside the zoo's own.

The zoo's list is what every run measures; these check that what it found
holds on architectures nobody tuned for: other encoders and decoders, vision
transformers and CNNs with many small modules, and three models at the sizes
of issue 13's table (BERT and GPT-2 at 4x128 tokens, resnet18 at 8x224x224),
where a call takes tens of milliseconds instead of the zoo's hundreds of
microseconds. Same rules: config objects, random weights, nothing downloaded.
"""

from __future__ import annotations

from functools import partial

from .models import _TEXT_FFN, IMAGE, VOCAB, ZOO, ZooModel, _hf, _image, _timm, _tokens

_VISION = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "image_size": IMAGE,
    "patch_size": 16,
}

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
            _hf(
                "SwinModel",
                "SwinConfig",
                _image,
                image_size=IMAGE,
                patch_size=4,
                embed_dim=32,
                depths=[1, 1],
                num_heads=[2, 4],
                window_size=4,
            ),
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
