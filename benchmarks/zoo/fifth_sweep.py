"""The fifth sweep's architectures (2026-11-27), on demand with the wider set.

Families the earlier sets did not hold: decoders with their own attention or
norm layouts (Gemma 3's sliding window, Cohere, StableLM, Granite, SmolLM3),
DeepSeek-V3's latent attention and routed experts, GraniteMoE, Jamba's
Mamba-attention hybrid, Funnel's pooling encoder, BigBird, Megatron-BERT,
three encoder-decoders (Marian, LED, BlenderbotSmall), SEW's audio front end, ViT-MAE, Data2Vec-Vision, Swin V2, PoolFormer, EfficientNet,
MobileViT V2, and timm's Swin, CaiT, ReXNet, DLA, CSPResNet, GC ViT, MViT V2,
Twins, Visformer, CoAtNet, ResNeSt, MixNet, LCNet, VoVNet and TResNet.
Every one matched eager under auto by the zoo's accuracy rule on its first
run; what each measured against inductor is in ``benchmarks/README.md``.
Nyströmformer, also tried, fails Dynamo's own trace (as in the fourth sweep).
Same rules as the zoo: config objects, random weights, nothing downloaded.
"""

from __future__ import annotations

from functools import partial

from .models import (
    _SEQ2SEQ,
    _SMALL_SWIN,
    _SMALL_VISION,
    _TEXT_FFN,
    IMAGE,
    VOCAB,
    ZooModel,
    _audio,
    _hf,
    _image,
    _timm,
    _tokens,
)

_DECODER = {**_TEXT_FFN, "num_key_value_heads": 2}
_LED = {k: v for k, v in _SEQ2SEQ.items() if k != "max_position_embeddings"}


def _decoder(family: str, name: str = "", **extra: object) -> ZooModel:
    """A small decoder of ``family`` (transformers' ``{family}Model``), named ``name``
    or ``hf_`` and the family in lower case."""
    build = _hf(f"{family}Model", f"{family}Config", _tokens, **_DECODER, **extra)
    return ZooModel(name or f"hf_{family.lower()}", "transformers", build)


FIFTH_SWEEP: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "hf_gemma3",
            "transformers",
            _hf("Gemma3TextModel", "Gemma3TextConfig", _tokens, **_DECODER, head_dim=32, sliding_window=16),
        ),
        _decoder("Cohere"),
        _decoder("StableLm"),
        _decoder("Granite"),
        _decoder("SmolLM3", pad_token_id=0),
        _decoder("GraniteMoe", num_local_experts=4, num_experts_per_tok=2),
        _decoder(
            "DeepseekV3",
            "hf_deepseek_v3",
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            first_k_dense_replace=1,
            kv_lora_rank=32,
            q_lora_rank=64,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
            n_group=1,
            topk_group=1,
        ),
        _decoder(
            "Jamba",
            num_experts=2,
            num_experts_per_tok=1,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=8,
            use_mamba_kernels=False,
        ),
        ZooModel(
            "hf_funnel",
            "transformers",
            _hf(
                "FunnelModel",
                "FunnelConfig",
                _tokens,
                vocab_size=VOCAB,
                block_sizes=[1, 1],
                d_model=128,
                n_head=4,
                d_head=32,
                d_inner=256,
            ),
        ),
        ZooModel(
            "hf_bigbird",
            "transformers",
            _hf("BigBirdModel", "BigBirdConfig", _tokens, **_TEXT_FFN, attention_type="original_full"),
        ),
        ZooModel(
            "hf_megatron_bert",
            "transformers",
            _hf("MegatronBertModel", "MegatronBertConfig", _tokens, **_TEXT_FFN),
        ),
        ZooModel(
            "hf_marian",
            "transformers",
            _hf(
                "MarianModel",
                "MarianConfig",
                partial(_tokens, 0),
                seq2seq=True,
                **_SEQ2SEQ,
                pad_token_id=0,
                decoder_start_token_id=0,
            ),
        ),
        ZooModel(
            "hf_led",  # Longformer's windowed attention in an encoder-decoder; .item() breaks its graph
            "transformers",
            _hf(
                "LEDModel",
                "LEDConfig",
                partial(_tokens, 0),
                seq2seq=True,
                **_LED,
                max_encoder_position_embeddings=128,
                max_decoder_position_embeddings=128,
                attention_window=16,
            ),
        ),
        ZooModel(
            "hf_blenderbot_small",
            "transformers",
            _hf(
                "BlenderbotSmallModel", "BlenderbotSmallConfig", partial(_tokens, 0), seq2seq=True, **_SEQ2SEQ
            ),
        ),
        ZooModel(
            "hf_sew",
            "transformers",
            _hf("SEWModel", "SEWConfig", _audio, **_TEXT_FFN, conv_dim=[32] * 13, num_conv_pos_embeddings=16),
        ),
        ZooModel(
            "hf_vitmae",
            "transformers",
            _hf("ViTMAEModel", "ViTMAEConfig", _image, **_SMALL_VISION, mask_ratio=0.0),
        ),
        ZooModel(
            "hf_data2vec_vision",
            "transformers",
            _hf("Data2VecVisionModel", "Data2VecVisionConfig", _image, **_SMALL_VISION),
        ),
        ZooModel(
            "hf_swinv2",
            "transformers",
            _hf("Swinv2Model", "Swinv2Config", _image, **_SMALL_SWIN),
        ),
        ZooModel(
            "hf_poolformer",
            "transformers",
            _hf(
                "PoolFormerModel",
                "PoolFormerConfig",
                _image,
                hidden_sizes=[32, 64, 128, 256],
                depths=[1, 1, 1, 1],
            ),
        ),
        ZooModel(
            "hf_efficientnet",
            "transformers",
            _hf(
                "EfficientNetModel",
                "EfficientNetConfig",
                _image,
                image_size=IMAGE,
                width_coefficient=0.5,
                depth_coefficient=0.5,
                hidden_dim=640,  # the top convolution's width at this coefficient
            ),
        ),
        ZooModel(
            "hf_mobilevitv2",
            "transformers",
            _hf("MobileViTV2Model", "MobileViTV2Config", _image, image_size=IMAGE, width_multiplier=0.5),
        ),
        ZooModel(
            "timm_swin",
            "timm",
            _timm(
                "swin_tiny_patch4_window7_224",
                img_size=IMAGE,
                window_size=4,
                embed_dim=32,
                depths=(1, 1),
                num_heads=(2, 4),
            ),
        ),
        ZooModel("timm_cait", "timm", _timm("cait_xxs24_224", img_size=IMAGE, depth=2, embed_dim=96)),
        ZooModel("timm_rexnet", "timm", _timm("rexnet_100")),
        ZooModel("timm_dla", "timm", _timm("dla34")),
        ZooModel("timm_cspresnet", "timm", _timm("cspresnet50")),
        ZooModel("timm_gcvit", "timm", _timm("gcvit_xxtiny", img_size=IMAGE)),
        ZooModel("timm_mvitv2", "timm", _timm("mvitv2_tiny", img_size=IMAGE)),
        ZooModel("timm_twins", "timm", _timm("twins_svt_small")),
        ZooModel("timm_visformer", "timm", _timm("visformer_tiny", img_size=IMAGE)),
        ZooModel("timm_coatnet", "timm", _timm("coatnet_nano_rw_224", img_size=IMAGE)),
        ZooModel("timm_resnest", "timm", _timm("resnest14d")),
        ZooModel("timm_mixnet", "timm", _timm("mixnet_s")),
        ZooModel("timm_lcnet", "timm", _timm("lcnet_050")),
        ZooModel("timm_vovnet", "timm", _timm("ese_vovnet19b_dw")),
        ZooModel("timm_tresnet", "timm", _timm("tresnet_m")),
    )
}
