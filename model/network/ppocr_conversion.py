"""Converting rapidocr's PP-OCRv6 ONNX file into weights for the torch recognizer
(model/network/ppocr_tower.py).

`convert_onnx` reads the initializers once (it needs the `onnx` package) and writes a
safetensors file whose keys are the recognizer's parameter names; the neck's three batch norms
are folded into their convs there, so every conv carries a bias. The file's metadata holds the
source's sha256 (`CHECKSUM_KEY`) and the dictionary text (`CHARACTERS_KEY`).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gravityocr.model.network.ppocr_tower import PPOCRv6Recognizer, TowerConfig

CHECKSUM_KEY = "source_sha256"
CHARACTERS_KEY = "character"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _graph_order_convs(model: PPOCRv6Recognizer) -> list[nn.Conv2d]:
    """The module's convs in the order their ONNX Conv nodes appear in the graph."""
    stem = model.backbone.stem
    convs = [stem.conv1, stem.conv2a, stem.conv2b, stem.conv3, stem.conv4]
    for block in model.backbone.blocks:
        convs.append(block.mixer)
        if getattr(block, "se", None) is not None:
            convs += [block.se.reduce, block.se.expand]
        convs += [block.fc1, block.fc2]
    neck = model.neck
    return convs + [neck.shortcut, neck.conv_in, neck.conv_dw]


def _graph_order_linears(model: PPOCRv6Recognizer) -> list[nn.Linear]:
    linears = []
    for block in model.neck.blocks:
        linears += [block.attn.qkv, block.attn.proj, block.fc1, block.fc2]
    return linears + [model.head.fc]


def _graph_order_norms(model: PPOCRv6Recognizer) -> list[nn.LayerNorm]:
    norms = []
    for block in model.neck.blocks:
        norms += [block.norm1, block.norm2]
    return norms + [model.neck.norm]


def _reachability(nodes, resolve, hops: int = 4):
    """reaches(a, b): whether node b reads, within `hops` nodes, what node a writes."""
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(resolve(name), []).append(node)

    def reaches(start, goal) -> bool:
        frontier = [start]
        for _ in range(hops):
            frontier = [user for node in frontier for out in node.output for user in readers.get(resolve(out), [])]
            if any(node is goal for node in frontier):
                return True
        return False

    return reaches


def onnx_state_dict(onnx_path: str | Path, config: TowerConfig | None = None) -> tuple[dict[str, torch.Tensor], str]:
    """The module's float32 state dict read from the ONNX initializers, and the dictionary text.

    Every Conv, MatMul and layer-norm node is matched to its module in graph order, and each
    match is checked (weight shape, stride, groups, padding, layer-norm epsilon), so a graph
    that differs from this architecture fails here rather than converting silently.
    """
    import onnx
    from onnx import numpy_helper

    graph_model = onnx.load(str(onnx_path))
    graph = graph_model.graph
    inits = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    alias: dict[str, str] = {}
    for node in graph.node:  # Identity nodes are pure renames
        if node.op_type == "Identity":
            alias[node.output[0]] = alias.get(node.input[0], node.input[0])

    def resolve(name: str) -> str:
        return alias.get(name, name)

    consumers: dict[str, list] = {}
    for node in graph.node:
        if node.op_type != "Identity":
            for name in node.input:
                consumers.setdefault(resolve(name), []).append(node)

    def only_consumer(node):
        users = consumers.get(resolve(node.output[0]), [])
        if len(users) != 1:
            raise ValueError(f"{node.name}: expected one consumer, found {len(users)}")
        return users[0]

    def const_input(node):
        found = [resolve(name) for name in node.input if resolve(name) in inits]
        if len(found) != 1:
            raise ValueError(f"{node.name}: expected one constant input, found {found}")
        return inits[found[0]]

    model = PPOCRv6Recognizer(config)
    names = {module: name for name, module in model.named_modules()}
    state: dict[str, torch.Tensor] = {}

    conv_nodes = [node for node in graph.node if node.op_type == "Conv"]
    convs = _graph_order_convs(model)
    if len(conv_nodes) != len(convs):
        raise ValueError(f"graph has {len(conv_nodes)} Conv nodes, the module {len(convs)}")
    reaches = _reachability(graph.node, resolve)
    neck = model.neck
    node_of = dict(zip(convs, conv_nodes))
    if not reaches(node_of[neck.conv_in], node_of[neck.conv_dw]) or reaches(node_of[neck.shortcut], node_of[neck.conv_dw]):
        raise ValueError("the neck's shortcut and input convs are not in the expected graph order")
    for node, conv in zip(conv_nodes, convs):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        weight = inits[resolve(node.input[1])].astype(np.float32)
        if attrs.get("auto_pad", b"NOTSET") == b"SAME_UPPER":
            if tuple(attrs["kernel_shape"]) != (2, 2) or tuple(attrs.get("strides", (1, 1))) != (1, 1):
                raise ValueError(f"{node.name}: SAME_UPPER is only handled for 2×2 stride-1 convs")
            pads = (0, 0)  # the module pads bottom/right explicitly
        else:
            top, left, bottom, right = attrs.get("pads", (0, 0, 0, 0))
            if (top, left) != (bottom, right):
                raise ValueError(f"{node.name}: asymmetric pads {attrs['pads']}")
            pads = (top, left)
        if (tuple(weight.shape) != tuple(conv.weight.shape) or tuple(attrs["strides"]) != conv.stride
                or attrs.get("group", 1) != conv.groups or pads != conv.padding):
            raise ValueError(f"{node.name} does not match {names[conv]}: {weight.shape} {attrs}")
        user = only_consumer(node)
        if user.op_type == "Add":
            bias = const_input(user).reshape(-1).astype(np.float32)
        elif user.op_type == "BatchNormalization":
            gamma, beta, mean, var = (inits[resolve(name)].astype(np.float64) for name in user.input[1:5])
            epsilon = next((a.f for a in user.attribute if a.name == "epsilon"), 1e-5)
            scale = gamma / np.sqrt(var + epsilon)
            weight = (weight.astype(np.float64) * scale[:, None, None, None]).astype(np.float32)
            bias = (beta - mean * scale).astype(np.float32)
        else:
            raise ValueError(f"{node.name}: unexpected consumer {user.op_type}")
        state[f"{names[conv]}.weight"] = torch.from_numpy(np.ascontiguousarray(weight))
        state[f"{names[conv]}.bias"] = torch.from_numpy(np.ascontiguousarray(bias))

    matmul_nodes = [node for node in graph.node if node.op_type == "MatMul" and resolve(node.input[1]) in inits]
    linears = _graph_order_linears(model)
    if len(matmul_nodes) != len(linears):
        raise ValueError(f"graph has {len(matmul_nodes)} weight MatMuls, the module {len(linears)}")
    for node, linear in zip(matmul_nodes, linears):
        weight = inits[resolve(node.input[1])].astype(np.float32).T  # ONNX (in, out) → torch (out, in)
        if tuple(weight.shape) != tuple(linear.weight.shape):
            raise ValueError(f"{node.name} does not match {names[linear]}: {weight.shape}")
        state[f"{names[linear]}.weight"] = torch.from_numpy(np.ascontiguousarray(weight))
        state[f"{names[linear]}.bias"] = torch.from_numpy(const_input(only_consumer(node)).astype(np.float32))

    # Layer norm, decomposed: (x − mean) / Sqrt(var + eps) · weight + bias.
    sqrt_nodes = [node for node in graph.node if node.op_type == "Sqrt"]
    norms = _graph_order_norms(model)
    if len(sqrt_nodes) != len(norms):
        raise ValueError(f"graph has {len(sqrt_nodes)} layer norms, the module {len(norms)}")
    producer = {resolve(out): node for node in graph.node for out in node.output}
    for node, norm in zip(sqrt_nodes, norms):
        epsilon = float(const_input(producer[resolve(node.input[0])]))
        if not math.isclose(epsilon, norm.eps, rel_tol=1e-6):
            raise ValueError(f"{names[norm]}: graph epsilon {epsilon}, module {norm.eps}")
        div = only_consumer(node)
        mul = only_consumer(div)
        add = only_consumer(mul)
        state[f"{names[norm]}.weight"] = torch.from_numpy(const_input(mul).astype(np.float32))
        state[f"{names[norm]}.bias"] = torch.from_numpy(const_input(add).astype(np.float32))

    expected = set(model.state_dict())
    if set(state) != expected:
        raise ValueError(f"unmatched parameters: {sorted(expected ^ set(state))}")
    characters = {prop.key: prop.value for prop in graph_model.metadata_props}[CHARACTERS_KEY]
    return state, characters


def convert_onnx(onnx_path: str | Path, out_path: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write the weights of `onnx_path` as safetensors with metadata: the source file's
    sha256, its name, the dtype and the dictionary text (rapidocr's `character` metadata,
    one character per line). float32 keeps onnxruntime's numbers; float16 halves the file,
    but its rounding of the weights moves the probabilities far more than float32
    arithmetic does (loading computes in float32 either way)."""
    from safetensors.torch import save_file

    state, characters = onnx_state_dict(onnx_path)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        CHECKSUM_KEY: file_sha256(onnx_path),
        "source_file": Path(onnx_path).name,
        "dtype": str(dtype).removeprefix("torch."),
        CHARACTERS_KEY: characters,
    }
    save_file({name: tensor.to(dtype).contiguous() for name, tensor in state.items()}, str(out_path), metadata=metadata)
    return out_path


def rapidocr_model_path() -> Path:
    """The ONNX file inside the installed rapidocr package."""
    import rapidocr

    return Path(rapidocr.__file__).parent / "models" / "PP-OCRv6_rec_small.onnx"
