"""PP-OCRv6 text recognition (rapidocr's `models/PP-OCRv6_rec_small.onnx`, Apache-2.0) in plain torch.

The ONNX graph is reproduced op by op: a conv backbone (stem, then mixer blocks of a biased
depthwise 3×3 conv — the exporter already folded every backbone batch norm into conv biases —
an optional squeeze-excite, and a residual GELU 1×1 MLP; two downsampling blocks halve the
height only), an SVTR-style neck (average pool 3×2, 1×1 conv 384→120, a 1×7 depthwise conv,
two pre-norm transformer blocks of width 120 with 8 heads, a shortcut branch added back) and a
CTC classifier 120→18710 with softmax, kept as its own module (`CTCHead`).

Shapes for a (N, 3, 48, W) input: `feature_map` (N, 384, 3, ⌈W/4⌉) — the last 2-D map, the
input of the height pooling; `sequence` (N, ⌊⌈W/4⌉/2⌋, 120) — one step per 8 px of W, the
neck's output before the classifier. The backbone takes any height ≥ 48 (`features`); the
neck, like the ONNX graph, needs a pooled height of 1 (inputs 48 px high as rapidocr makes
them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

IMAGE_HEIGHT = 48
HARDSIGMOID_SLOPE = 0.1666667  # the graph's HardSigmoid alpha (Paddle's slope), not exactly 1/6
# The largest activations of a forward pass (the stem's first map and every block's MLP hidden
# map) hold 576 floats per input pixel column of a 48-px line.
ACTIVATION_BYTES_PER_COLUMN = 576 * 4
CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class TowerConfig:
    """The architecture of PP-OCRv6_rec_small; the defaults are the shipped model's."""

    stem_channels: tuple[int, int, int] = (48, 24, 96)  # first conv, 2×2 branch, stem output
    # (channels, squeeze-excite per block); a downsampling block (height ÷2, channels ×2) sits
    # between consecutive stages.
    stages: tuple[tuple[int, tuple[bool, ...]], ...] = (
        (96, (True, False, False)),
        (192, (True, False, True, False, True, False)),
        (384, (True, False)),
    )
    se_reduction: int = 4
    neck_dim: int = 120
    neck_depth: int = 2
    neck_heads: int = 8
    neck_mlp_ratio: int = 2
    neck_kernel: int = 7
    num_classes: int = 18710


@dataclass
class TowerOutput:
    """`sequence` (N, T, 120): the neck's output, the classifier's input; `feature_map`
    (N, 384, H/16, ⌈W/4⌉): the backbone's last map, before the height pooling."""

    sequence: torch.Tensor
    feature_map: torch.Tensor


# --- backbone ---------------------------------------------------------------------------
#
# The backbone runs channels-last: `forward` makes the input channels-last, every op keeps
# that layout, and each 1×1 conv runs as one matmul over the channel axis (`pointwise`). The
# numbers are those of the NCHW graph up to float rounding; on CPU this layout avoids the
# slow NCHW 1×1-conv path.

def pointwise(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """`conv(x)` for a 1×1 conv, as a matmul on the (N, H, W, C) view of a channels-last map;
    the result is channels-last too."""
    y = F.linear(x.permute(0, 2, 3, 1), conv.weight.flatten(1), conv.bias)
    return y.permute(0, 3, 1, 2)


def gelu_mlp(fc1: nn.Conv2d, fc2: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    return pointwise(fc2, F.gelu(pointwise(fc1, x)))


class Stem(nn.Module):
    """Two stride-2 3×3 convs around a 2×2 conv branch concatenated with a 2×2 max pool.

    The graph's SAME_UPPER auto-pads (2×2 kernels, stride 1) pad one row at the bottom and
    one column at the right; they are explicit pads here. The 2×2 stride-1 max pool is the
    maximum of four shifted views of the map padded with −inf (ONNX pooling ignores padded
    positions), which is much faster on CPU than `max_pool2d` with these shapes.
    """

    def __init__(self, c1: int, c2: int, out: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c1, 3, stride=2, padding=1)
        self.conv2a = nn.Conv2d(c1, c2, 2)
        self.conv2b = nn.Conv2d(c2, c1, 2)
        self.conv3 = nn.Conv2d(2 * c1, out // 2, 3, stride=2, padding=1)
        self.conv4 = nn.Conv2d(out // 2, out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Activations in place (autograd-safe here): fewer fresh large maps, see PPOCRv6Recognizer.
        x = F.relu(self.conv1(x), inplace=True)
        branch = F.relu(self.conv2a(F.pad(x, (0, 1, 0, 1))), inplace=True)
        branch = F.relu(self.conv2b(F.pad(branch, (0, 1, 0, 1))), inplace=True)
        padded = F.pad(x, (0, 1, 0, 1), value=float("-inf"))
        pooled = torch.maximum(torch.maximum(padded[:, :, :-1, :-1], padded[:, :, :-1, 1:]),
                               torch.maximum(padded[:, :, 1:, :-1], padded[:, :, 1:, 1:]))
        x = F.relu(self.conv3(torch.cat([pooled, branch], dim=1)), inplace=True)
        return F.relu(pointwise(self.conv4, x), inplace=True)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels // reduction, 1)
        self.expand = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean runs over the whole map, zero padding included, exactly as in the graph:
        # a line's features depend on how far its batch pads it.
        gate = F.linear(F.relu(F.linear(x.mean(dim=(2, 3)), self.reduce.weight.flatten(1), self.reduce.bias)),
                        self.expand.weight.flatten(1), self.expand.bias)
        gate = (gate * HARDSIGMOID_SLOPE + 0.5).clamp_(0.0, 1.0)
        return x * gate[:, :, None, None]


class MixerBlock(nn.Module):
    """Biased depthwise 3×3 (re-parameterised, identity included), optional SE, then
    x + fc2(gelu(fc1(x))) with a 2× hidden width."""

    def __init__(self, channels: int, se: bool, se_reduction: int):
        super().__init__()
        self.mixer = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.se = SqueezeExcite(channels, se_reduction) if se else None
        self.fc1 = nn.Conv2d(channels, 2 * channels, 1)
        self.fc2 = nn.Conv2d(2 * channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mixer(x)
        if self.se is not None:
            x = self.se(x)
        return gelu_mlp(self.fc1, self.fc2, x).add_(x)


class DownsampleBlock(nn.Module):
    """Depthwise 3×3 with stride (2, 1) — height halves, width stays — then
    fc2(gelu(fc1(x))) widening the channels 2×, without a residual."""

    def __init__(self, channels: int):
        super().__init__()
        self.mixer = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, groups=channels)
        self.fc1 = nn.Conv2d(channels, 2 * channels, 1)
        self.fc2 = nn.Conv2d(2 * channels, 2 * channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_mlp(self.fc1, self.fc2, self.mixer(x))


class Backbone(nn.Module):
    def __init__(self, config: TowerConfig):
        super().__init__()
        c1, c2, out = config.stem_channels
        self.stem = Stem(c1, c2, out)
        blocks: list[nn.Module] = []
        for index, (channels, se_flags) in enumerate(config.stages):
            if index > 0:
                blocks.append(DownsampleBlock(config.stages[index - 1][0]))
            blocks.extend(MixerBlock(channels, se, config.se_reduction) for se in se_flags)
        self.blocks = nn.Sequential(*blocks)
        self.out_channels = config.stages[-1][0]

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 384, H/16, ⌈W/4⌉), channels-last in memory."""
        return self.blocks(self.stem(pixels.contiguous(memory_format=torch.channels_last)))


# --- neck -------------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        q, k, v = self.qkv(x).reshape(n, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.proj(out.transpose(1, 2).reshape(n, length, dim))


class TransformerBlock(nn.Module):
    """Pre-norm: x + attn(norm1(x)), then x + fc2(silu(fc1(norm2(x))))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.silu(self.fc1(self.norm2(x))))


class Neck(nn.Module):
    """Height pooling to one row, then the sequence encoder; returns (N, T, dim)."""

    def __init__(self, in_channels: int, config: TowerConfig):
        super().__init__()
        dim = config.neck_dim
        self.shortcut = nn.Conv2d(in_channels, dim, 1)
        self.conv_in = nn.Conv2d(in_channels, dim, 1)
        self.conv_dw = nn.Conv2d(dim, dim, (1, config.neck_kernel), padding=(0, config.neck_kernel // 2), groups=dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, config.neck_heads, config.neck_mlp_ratio) for _ in range(config.neck_depth)
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, feature_map: torch.Tensor) -> torch.Tensor:
        pooled = F.avg_pool2d(feature_map, (3, 2), stride=(3, 2))
        if pooled.shape[2] != 1:
            raise ValueError(
                f"the neck needs a pooled height of 1 (input height 48 as rapidocr makes it); "
                f"got a feature map of height {feature_map.shape[2]}"
            )
        shortcut = F.silu(pointwise(self.shortcut, pooled))
        x = F.silu(pointwise(self.conv_in, pooled))
        x = x + F.silu(self.conv_dw(x))
        x = x.flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) + shortcut.flatten(2).transpose(1, 2)


class CTCHead(nn.Module):
    """Per-step class probabilities (softmax over 18710 classes; blank is class 0).

    Without autograd, when the logits would exceed `4 · chunk_bytes` (a batch of long lines),
    they are made in blocks of at most `chunk_bytes` in one reused buffer and softmaxed
    straight into the output, so the only large allocation is the output itself (see
    `PPOCRv6Recognizer` on why fresh large tensors are slow).
    """

    def __init__(self, dim: int, num_classes: int, chunk_bytes: int = CHUNK_BYTES):
        super().__init__()
        self.fc = nn.Linear(dim, num_classes)
        self.chunk_bytes = chunk_bytes

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        rows = sequence.reshape(-1, sequence.shape[-1])
        classes = self.fc.out_features
        if (torch.is_grad_enabled() or sequence.device.type != "cpu"
                or rows.shape[0] * classes * sequence.element_size() <= 4 * self.chunk_bytes):
            return self.fc(sequence).softmax(dim=-1)
        out = torch.empty(rows.shape[0], classes, dtype=sequence.dtype, device=sequence.device)
        step = max(1, self.chunk_bytes // (classes * sequence.element_size()))
        logits = torch.empty(min(step, rows.shape[0]), classes, dtype=sequence.dtype, device=sequence.device)
        weight = self.fc.weight.t()
        for start in range(0, rows.shape[0], step):
            block = rows[start:start + step]
            scratch = logits[:block.shape[0]]
            torch.addmm(self.fc.bias, block, weight, out=scratch)
            torch.softmax(scratch, dim=-1, out=out[start:start + block.shape[0]])
        return out.reshape(*sequence.shape[:-1], classes)


class PPOCRv6Recognizer(nn.Module):
    """Backbone + neck (`forward` → `TowerOutput`) and the CTC head (`head`, `probabilities`).

    `pixels` are (N, 3, 48, W) as `preprocess_batch` makes them. `characters` is filled by
    `load_ppocr_recognizer`: index i of the head's output reads as `characters[i]`.

    On CPU a batch runs in chunks of lines whose largest activation stays under
    `chunk_bytes` (every op is per line, so the results are the batch's). Each large fresh
    tensor costs page faults on first touch (the CPU allocator returns big blocks to the OS
    on free and maps new ones); small chunks reuse the same memory instead. onnxruntime
    avoids the same cost with its arena. With more than one torch thread on cores that other
    processes keep busy, every op waits for a descheduled thread, so many small chunks cost
    more than the page faults they save: raise `chunk_bytes` there, or use one thread.
    """

    def __init__(self, config: TowerConfig | None = None, chunk_bytes: int = CHUNK_BYTES):
        super().__init__()
        self.config = config or TowerConfig()
        self.chunk_bytes = chunk_bytes
        self.backbone = Backbone(self.config)
        self.neck = Neck(self.backbone.out_channels, self.config)
        self.head = CTCHead(self.config.neck_dim, self.config.num_classes, chunk_bytes)
        self.characters: list[str] = []

    def _chunks(self, pixels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if pixels.device.type != "cpu":  # accelerators cache their memory: one chunk
            return (pixels,)
        per_line = ACTIVATION_BYTES_PER_COLUMN * pixels.shape[-1] * pixels.shape[-2] / IMAGE_HEIGHT
        per_line *= pixels.element_size() / 4
        return pixels.split(max(1, int(self.chunk_bytes // per_line)))

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The backbone's last 2-D map (N, 384, H/16, ⌈W/4⌉); any height ≥ 48."""
        maps = [self.backbone(chunk) for chunk in self._chunks(pixels)]
        return maps[0] if len(maps) == 1 else torch.cat(maps)

    def forward(self, pixels: torch.Tensor) -> TowerOutput:
        maps, sequences = [], []
        for chunk in self._chunks(pixels):
            maps.append(self.backbone(chunk))
            sequences.append(self.neck(maps[-1]))
        if len(maps) == 1:
            return TowerOutput(sequence=sequences[0], feature_map=maps[0])
        return TowerOutput(sequence=torch.cat(sequences), feature_map=torch.cat(maps))

    def probabilities(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, T, 18710) CTC probabilities, what the ONNX model outputs."""
        return self.head(self.forward(pixels).sequence)

    def read(self, pixels: torch.Tensor) -> list[str]:
        """Greedy CTC transcripts, decoded as rapidocr decodes them."""
        return ctc_greedy_decode(self.probabilities(pixels), self.characters)


def ctc_greedy_decode(probabilities: torch.Tensor, characters: Sequence[str]) -> list[str]:
    """Per line: argmax per step, repeats merged, blanks (class 0) dropped."""
    best = probabilities.argmax(dim=-1)
    keep = best != 0
    keep[:, 1:] &= best[:, 1:] != best[:, :-1]
    return ["".join(characters[i] for i in row[mask].tolist()) for row, mask in zip(best, keep)]
