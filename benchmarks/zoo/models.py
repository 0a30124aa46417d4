"""The zoo's models: real architectures from their libraries' config objects with
random weights (nothing is downloaded), and the code patterns people write
around models (graph breaks, data-dependent shapes, Python loops, dict and list
outputs, in-place updates of inputs).

Each entry builds ``(model, inputs)`` on a device in a dtype. Sizes are small
enough that a call takes well under a second on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

BATCH, SEQ, VOCAB, IMAGE = 2, 64, 1000, 64


@dataclass(frozen=True)
class ZooModel:
    name: str
    source: str  # "transformers", "timm" or "pattern"
    build: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]
    trains: bool = False  # also measured as a training step


def _tokens(*extra: int, batch: int = BATCH, seq: int = SEQ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randint(0, VOCAB, (batch, seq), generator=g) for _ in range(1 + len(extra)))


def _image(batch: int = BATCH, size: int = IMAGE) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0)),)


def _audio(batch: int = BATCH, samples: int = 3200) -> tuple[torch.Tensor]:
    return (torch.randn(batch, samples, generator=torch.Generator().manual_seed(0)),)


def _hf(
    model_cls: str, config_cls: str, inputs: Callable[[], tuple[torch.Tensor, ...]], seq2seq=False, **config
):
    def build():
        _torchvision_without_its_kernels()
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(cfg)
        return (EncoderDecoder(model) if seq2seq else model), inputs()

    return build


class EncoderDecoder(torch.nn.Module):
    """Calls an encoder-decoder with its token ids by name, as users do."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)


_TEXT = {"vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
_TEXT_FFN = {**_TEXT, "intermediate_size": 256, "max_position_embeddings": 128}
_STAGES = {"hidden_sizes": [32, 64, 128, 256], "depths": [1, 1, 1, 1]}
# A small vision transformer on the zoo's images (the wider set and its sweeps).
_SMALL_VISION = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "image_size": IMAGE,
    "patch_size": 16,
}
# A two-stage Swin (V1 and V2 alike) on the zoo's images: windows of 4 patches of 4 pixels.
_SMALL_SWIN = {
    "image_size": IMAGE,
    "patch_size": 4,
    "embed_dim": 32,
    "depths": [1, 1],
    "num_heads": [2, 4],
    "window_size": 4,
}
_SEQ2SEQ = {
    "vocab_size": VOCAB,
    "d_model": 128,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 256,
    "decoder_ffn_dim": 256,
    "max_position_embeddings": 128,
}


def _timm(name: str, inputs: Callable[[], tuple[torch.Tensor, ...]] = _image, **kwargs):
    def build():
        _torchvision_without_its_kernels()
        import timm

        torch.manual_seed(0)
        return timm.create_model(name, pretrained=False, **kwargs), inputs()

    return build


def _torchvision_without_its_kernels() -> None:
    """timm and transformers import torchvision. The torchvision wheels on PyPI are CUDA builds
    whose ``_C`` extension cannot load beside the CPU build of torch, and then
    ``import torchvision`` fails registering fake kernels for two of its ops
    (``nms``, ``qnms``) that were never defined. Defining their schemas first
    lets it import; the classification models here use none of its ops."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None or torch.cuda.is_available():
        return
    for op in ("nms", "qnms"):
        with contextlib.suppress(RuntimeError):  # defined already: its extension did load
            torch.library.define(
                f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            )


class GraphBreak(torch.nn.Module):
    """``print`` and a branch on ``.item()`` in ``forward``: three Dynamo graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
        self.b = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))

    def forward(self, x):
        h = self.a(x)
        print("", end="")
        if h.mean().item() > 0:
            h = h * 2
        return self.b(h)


class _CheckedBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(128)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128))

    def forward(self, x):
        h = x + self.ffn(self.norm(x))
        if not torch.isfinite(h).all():  # a check that breaks the graph inside the layer
            raise FloatingPointError("non-finite activations")
        return h


class LayerGraphBreak(torch.nn.Module):
    """A graph break inside each of four identical layers: Dynamo compiles the
    layer's code once and runs that graph with every layer's parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_CheckedBlock() for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class DataDependent(torch.nn.Module):
    """``nonzero`` and a boolean mask: shapes that depend on the data."""

    def __init__(self) -> None:
        super().__init__()
        self.l, self.m = torch.nn.Linear(256, 256), torch.nn.Linear(256, 64)

    def forward(self, x):
        h = self.l(x)
        idx = torch.nonzero(h[:, 0] > 0).squeeze(1)
        return self.m(h[idx]).sum(0) + self.m(h[h[:, 1] > 0]).sum(0)


class PythonLoop(torch.nn.Module):
    """A Python ``for`` over layers and a ``while`` on a Python counter."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(128, 128) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x)) + x
        steps = 0
        while steps < 3:
            x = x * 0.5 + x.sin()
            steps += 1
        return x


class DictListOutputs(torch.nn.Module):
    """A dict of outputs with a list inside, as detection and multi-task heads return."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU())
        self.heads = torch.nn.ModuleList(torch.nn.Linear(256, n) for n in (10, 4, 1))

    def forward(self, x):
        h = self.trunk(x)
        outs = [head(h) for head in self.heads]
        return {"logits": outs[0], "aux": [outs[1], torch.sigmoid(outs[2])], "features": h}


class InplaceInput(torch.nn.Module):
    """Normalises its input in place (a running buffer too), then computes."""

    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(128, 128)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        x.sub_(x.mean(-1, keepdim=True))
        self.calls.add_(1)
        return torch.relu(self.l(x)) * 2


def _pattern(cls, *shape: int, inputs: Callable[[], tuple[torch.Tensor, ...]] | None = None):
    """``cls()`` on one normal tensor of ``shape``, or on what ``inputs`` makes."""

    def build():
        torch.manual_seed(0)
        if inputs is not None:
            return cls(), inputs()
        return cls(), (torch.randn(*shape, generator=torch.Generator().manual_seed(0)),)

    return build


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "hf_bert", "transformers", _hf("BertModel", "BertConfig", _tokens, **_TEXT_FFN), trains=True
        ),
        ZooModel(
            "hf_roberta",
            "transformers",
            _hf("RobertaModel", "RobertaConfig", _tokens, **_TEXT_FFN, pad_token_id=1),
        ),
        ZooModel(
            "hf_distilbert",
            "transformers",
            _hf(
                "DistilBertModel",
                "DistilBertConfig",
                _tokens,
                vocab_size=VOCAB,
                dim=128,
                n_layers=2,
                n_heads=4,
                hidden_dim=256,
            ),
        ),
        ZooModel(
            "hf_albert",
            "transformers",
            _hf("AlbertModel", "AlbertConfig", _tokens, **_TEXT_FFN, embedding_size=64),
        ),
        ZooModel(
            "hf_gpt2",
            "transformers",
            _hf(
                "GPT2Model",
                "GPT2Config",
                _tokens,
                vocab_size=VOCAB,
                n_embd=128,
                n_layer=2,
                n_head=4,
                n_positions=128,
            ),
            trains=True,
        ),
        ZooModel(
            "hf_llama",
            "transformers",
            _hf("LlamaModel", "LlamaConfig", _tokens, **_TEXT_FFN, num_key_value_heads=2),
        ),
        ZooModel(
            "hf_mixtral",  # mixture of experts: a top-k router, a sort of expert ids, grouped matmuls
            "transformers",
            _hf(
                "MixtralModel",
                "MixtralConfig",
                _tokens,
                **_TEXT_FFN,
                num_key_value_heads=2,
                num_local_experts=4,
                num_experts_per_tok=2,
            ),
        ),
        ZooModel(
            "hf_t5",
            "transformers",
            _hf(
                "T5Model",
                "T5Config",
                lambda: _tokens(1),
                seq2seq=True,
                vocab_size=VOCAB,
                d_model=128,
                d_kv=32,
                d_ff=256,
                num_layers=2,
                num_heads=4,
            ),
        ),
        ZooModel(
            "hf_bart",
            "transformers",
            _hf("BartModel", "BartConfig", _tokens, **_SEQ2SEQ),
        ),
        ZooModel(
            "hf_vit",
            "transformers",
            _hf(
                "ViTModel",
                "ViTConfig",
                _image,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=256,
                image_size=IMAGE,
                patch_size=16,
            ),
            trains=True,
        ),
        ZooModel(
            "hf_resnet",
            "transformers",
            _hf("ResNetModel", "ResNetConfig", _image, embedding_size=32, **_STAGES),
            trains=True,
        ),
        ZooModel("hf_convnext", "transformers", _hf("ConvNextModel", "ConvNextConfig", _image, **_STAGES)),
        ZooModel(
            "hf_mobilenet_v2",
            "transformers",
            _hf("MobileNetV2Model", "MobileNetV2Config", _image, image_size=IMAGE, depth_multiplier=0.35),
        ),
        ZooModel("timm_resnet18", "timm", _timm("resnet18"), trains=True),
        ZooModel("timm_convnext_atto", "timm", _timm("convnext_atto")),
        ZooModel("timm_mobilenetv3", "timm", _timm("mobilenetv3_small_100")),
        ZooModel("timm_efficientnet_b0", "timm", _timm("efficientnet_b0")),
        ZooModel("timm_vit_tiny", "timm", _timm("vit_tiny_patch16_224", img_size=IMAGE)),
        ZooModel("timm_regnetx_002", "timm", _timm("regnetx_002")),
        ZooModel("graph_break", "pattern", _pattern(GraphBreak, 64, 256), trains=True),
        ZooModel("layer_graph_break", "pattern", _pattern(LayerGraphBreak, 8, 64, 128), trains=True),
        ZooModel("data_dependent", "pattern", _pattern(DataDependent, 64, 256)),
        ZooModel("python_loop", "pattern", _pattern(PythonLoop, 32, 128)),
        ZooModel("dict_list_outputs", "pattern", _pattern(DictListOutputs, 32, 128)),
        ZooModel("inplace_input", "pattern", _pattern(InplaceInput, 32, 128)),
    )
}
