"""The third sweep's architectures (2026-11-27), on demand with the wider set.

Families the zoo and its wider set did not hold yet: rotary and convolutional
text encoders (RoFormer, SqueezeBERT, ESM), more decoders (OLMo, StarCoder2,
CodeGen and GPT-J's interleaved rotary; OLMoE's and Qwen2-MoE's mixtures of
experts, added later), a multilingual encoder-decoder
(mBART), HuBERT, a detection transformer (YOLOS) and timm's newer CNNs and
hybrids. Auto passed every one, within the dashboard's accuracy rule and
without a fallback (``benchmarks/README.md``). Same rules as the zoo: config
objects, random weights, nothing downloaded.
"""

from __future__ import annotations

from functools import partial

import torch

from .models import _SEQ2SEQ, _TEXT_FFN, IMAGE, VOCAB, ZooModel, _audio, _hf, _image, _timm, _tokens

_GPTJ_LIKE = {
    "vocab_size": VOCAB,
    "n_embd": 128,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 128,
    "rotary_dim": 16,
}
_SPEECH = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "conv_dim": (64, 64, 64),
    "conv_stride": (5, 2, 2),
    "conv_kernel": (10, 3, 3),
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
}


def _protein_tokens() -> tuple[torch.Tensor]:
    """ESM's amino-acid tokens (4 to 29), clear of its padding and special ids."""
    return (torch.randint(4, 30, (2, 64), generator=torch.Generator().manual_seed(0)),)


THIRD_SWEEP: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "hf_roformer",
            "transformers",
            _hf("RoFormerModel", "RoFormerConfig", _tokens, **_TEXT_FFN, embedding_size=128),
        ),
        ZooModel(
            "hf_squeezebert",
            "transformers",
            _hf("SqueezeBertModel", "SqueezeBertConfig", _tokens, **_TEXT_FFN, embedding_size=128),
        ),
        ZooModel(
            "hf_esm",
            "transformers",
            _hf(
                "EsmModel",
                "EsmConfig",
                _protein_tokens,
                vocab_size=33,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=256,
                max_position_embeddings=130,
                position_embedding_type="rotary",
                pad_token_id=1,
            ),
        ),
        ZooModel(
            "hf_mbart",
            "transformers",
            _hf("MBartModel", "MBartConfig", lambda: _tokens(0), seq2seq=True, **_SEQ2SEQ),
        ),
        ZooModel("hf_olmo", "transformers", _hf("OlmoModel", "OlmoConfig", _tokens, **_TEXT_FFN)),
        ZooModel(
            "hf_olmoe",  # mixture of experts: 8 experts, top 2
            "transformers",
            _hf(
                "OlmoeModel",
                "OlmoeConfig",
                _tokens,
                **_TEXT_FFN,
                num_key_value_heads=2,
                num_experts=8,
                num_experts_per_tok=2,
            ),
        ),
        ZooModel(
            "hf_qwen2_moe",  # mixture of experts with a gated shared expert
            "transformers",
            _hf(
                "Qwen2MoeModel",
                "Qwen2MoeConfig",
                _tokens,
                **_TEXT_FFN,
                num_key_value_heads=2,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=128,
                shared_expert_intermediate_size=256,
            ),
        ),
        ZooModel(
            "hf_starcoder2",
            "transformers",
            _hf("Starcoder2Model", "Starcoder2Config", _tokens, **_TEXT_FFN, num_key_value_heads=2),
        ),
        ZooModel("hf_codegen", "transformers", _hf("CodeGenModel", "CodeGenConfig", _tokens, **_GPTJ_LIKE)),
        ZooModel("hf_gptj", "transformers", _hf("GPTJModel", "GPTJConfig", _tokens, **_GPTJ_LIKE)),
        ZooModel(
            "hf_hubert",
            "transformers",
            _hf("HubertModel", "HubertConfig", partial(_audio, samples=8000), **_SPEECH),
        ),
        ZooModel(
            "hf_yolos",
            "transformers",
            _hf(
                "YolosModel",
                "YolosConfig",
                _image,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=256,
                image_size=[64, 64],
                patch_size=16,
                num_detection_tokens=10,
            ),
        ),
        ZooModel("timm_resmlp", "timm", _timm("resmlp_12_224", img_size=IMAGE)),
        ZooModel("timm_hrnet", "timm", _timm("hrnet_w18_small")),
        ZooModel("timm_edgenext", "timm", _timm("edgenext_xx_small")),
        ZooModel("timm_fastvit", "timm", _timm("fastvit_t8")),
        ZooModel("timm_repvit", "timm", _timm("repvit_m1")),
        ZooModel("timm_hgnetv2", "timm", _timm("hgnetv2_b0")),
        ZooModel("timm_res2net", "timm", _timm("res2net50_14w_8s")),
        ZooModel("timm_coat", "timm", _timm("coat_lite_tiny", img_size=IMAGE)),
    )
}
