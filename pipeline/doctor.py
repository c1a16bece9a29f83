"""`fscil doctor`: does this machine compute the committed numbers bit for bit?

Digests (sha256 of the float32 bytes) of the CPU kernels the pipeline runs, then of one training step of the run's
network (every leaf module's output, every gradient; base mode, then an incremental step of g_inc), are compared
with a reference written on the machine that made the committed metrics.json (`fscil doctor --write`). Equal
digests: the pinned kernels take the same code paths here, so the stages write the same bytes. The first digest that
differs names the kernel or module where this machine parts ways (docs/reliability.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.errors import FSCILError
from pipeline.portable import OPT_OUT

REFERENCE = Path(__file__).with_name("doctor_reference.txt")


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def _randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _grad_digest(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> str:
    """Digest of fn's output and of the gradients of every input (upstream gradient fixed)."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    y = fn(*leaves)
    y.backward(_randn(99, *y.shape))
    return _digest(y, *(t.grad for t in leaves))


def _conv(n: int, c_in: int, c_out: int, hw: int, k: int, stride: int = 1, groups: int = 1) -> Callable[[], str]:
    return lambda: _grad_digest(lambda x, w: F.conv2d(x, w, padding=k // 2, stride=stride, groups=groups),
                                _randn(1, n, c_in, hw, hw), _randn(2, c_out, c_in // groups, k, k) * 0.1)


def _gemm(m: int, k: int, n: int) -> Callable[[], str]:
    return lambda: _grad_digest(F.linear, _randn(4, m, k), _randn(5, n, k) * 0.1)


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], str]:
    return lambda: _grad_digest(fn, _randn(7, 64, 1024))


# name -> digest of one kernel's output and gradients, in the order the pipeline meets them: the backbone's
# convolutions (oneDNN), normalisation, GEMMs (MKL: linear layers, the scan's projections), the scan's element-wise
# functions, reductions
KERNELS: dict[str, Callable[[], str]] = {
    "conv2d 3x3 (64, 3 -> 16, 32 px)": _conv(64, 3, 16, 32, 3),
    "conv2d 3x3 (64, 64 -> 128, 8 px)": _conv(64, 64, 128, 8, 3),
    "conv2d 1x1 stride 2 (64, 32 -> 64, 16 px)": _conv(64, 32, 64, 16, 1, 2),
    "conv2d depthwise 3x3 (64, 256, 2 px)": _conv(64, 256, 256, 2, 3, groups=256),
    "batch_norm (64, 64, 16 px)": lambda: _grad_digest(lambda x: F.batch_norm(x, None, None, training=True),
                                                       _randn(8, 64, 64, 16, 16)),
    "layer_norm (64, 256)": lambda: _grad_digest(lambda x: F.layer_norm(x, (256,)), _randn(8, 64, 256)),
    "gemm (256 x 128 -> 256)": _gemm(256, 128, 256),
    "gemm (256 x 256 -> 128)": _gemm(256, 256, 128),
    "gemm (512 x 640 -> 640)": _gemm(512, 640, 640),
    "gemm (64 x 2560 -> 640)": _gemm(64, 2560, 640),
    "batched gemm (einsum bkdl,kcd->bkcl)": lambda: _grad_digest(
        lambda x, w: torch.einsum("bkdl,kcd->bkcl", x, w), _randn(10, 64, 4, 256, 4), _randn(11, 4, 40, 256)),
    "exp": _unary(torch.exp),
    "log_softmax": _unary(lambda x: x.log_softmax(dim=1)),
    "softplus": _unary(F.softplus),
    "silu": _unary(F.silu),
    "leaky_relu": _unary(lambda x: F.leaky_relu(x, 0.1)),
    "sum, mean, norm": lambda: _digest(*(f(_randn(9, 64, 4096)) for f in (
        lambda x: x.sum(1), lambda x: x.mean(0), lambda x: x.norm(dim=1)))),
    "cumsum": lambda: _digest(torch.cumsum(_randn(9, 64, 4096), 1)),
}


def kernel_digests() -> list[tuple[str, str]]:
    return [(f"kernel {name}", fn()) for name, fn in KERNELS.items()]


def model_digests(model_cfg, num_classes: int, input_size: int, num_base: int) -> list[tuple[str, str]]:
    """One training step of the network the run builds (seed 0, a fixed batch): each leaf module's output and each
    gradient in base mode, then the same for an incremental step of g_inc on the base step's maps."""
    from pipeline.models.fscil import build_model

    model = build_model(model_cfg, num_classes=num_classes, input_size=input_size, seed=0).train()
    outs: list[tuple[str, torch.Tensor]] = []
    for name, module in model.named_modules():
        if name and not list(module.children()):
            module.register_forward_hook(lambda m, i, o, name=name: outs.append((name, o)))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, input_size, input_size, generator=g)
    y = torch.randint(0, num_base, (64,), generator=g)
    rows: list[tuple[str, str]] = []

    def step(mode: str, fn: Callable[[], torch.Tensor]) -> None:
        outs.clear()
        model.zero_grad()
        loss = F.cross_entropy(fn(), y)
        loss.backward()
        rows.append((f"{mode} loss", _digest(loss)))
        calls: dict[str, int] = {}
        for n, o in outs:  # a module called several times (a block's ReLU) gets one line per call
            calls[n] = calls.get(n, 0) + 1
            if torch.is_tensor(o):
                rows.append((f"{mode} out {n}" + (f" (call {calls[n]})" if calls[n] > 1 else ""), _digest(o)))
        rows.extend((f"{mode} grad {n}", _digest(p.grad)) for n, p in model.named_parameters() if p.grad is not None)

    step("base", lambda: model(x, num_seen=num_base))
    if model.projector.g_inc is not None:
        maps = model.forward_features(x).detach()
        model.projector.set_sessions(1)
        model.freeze_base()
        step("incremental", lambda: model.forward_head(maps, num_seen=num_base, mode="incremental")[0])
    return rows


def machine() -> str:
    """The CPU model, as /proc/cpuinfo names it (else the platform's name)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class Probe:
    header: dict
    digests: list[tuple[str, str]]

    def text(self) -> str:
        lines = [f"# {json.dumps(self.header, sort_keys=True)}"]
        return "\n".join(lines + [f"{name}: {value}" for name, value in self.digests]) + "\n"

    @classmethod
    def read(cls, path: Path) -> Probe:
        try:
            first, *rest = Path(path).read_text().splitlines()
            header = json.loads(first.removeprefix("# "))
            digests = [tuple(line.rsplit(": ", 1)) for line in rest if line.strip()]
            if not isinstance(header, dict) or "threads" not in header or any(len(d) != 2 for d in digests):
                raise ValueError("no header or digest lines")
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise FSCILError(f"{path}: not a reference written by `fscil doctor --write` ({err})") from None
        return cls(header, digests)  # type: ignore[arg-type]


def is_reference(path: Path) -> bool:
    try:
        Probe.read(path)
    except FSCILError:
        return False
    return True


def probe(cfg) -> Probe:
    """Every digest on this machine under the process's kernels, at the run's thread count and model."""
    from pipeline.data.presets import get_preset
    from pipeline.training.base_model import config_digest

    base, ways, _, sessions = cfg.data.protocol_shape()
    base = base or 60  # class_folder data leaves it to the data; the digests need a model, not the data's count
    size = get_preset(cfg.data.dataset, cfg.data.image_size).input_size
    header = {"cpu": machine(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "kernels": "native" if os.environ.get(OPT_OUT) == "native" else "pinned",
              "model": config_digest(cfg, ("model",))[:12]}
    return Probe(header, kernel_digests() + model_digests(cfg.model, base + ways * sessions, size, base))


def verdict(mine: Probe, reference: Probe) -> tuple[bool, str]:
    """(bit for bit, the one-line answer)."""
    for key in ("threads", "model"):
        if mine.header[key] != reference.header.get(key):
            raise FSCILError(f"the reference was made with {key} {reference.header.get(key)}, these params give "
                             f"{mine.header[key]}; run `fscil doctor` with the committed params.yaml")
    theirs = dict(reference.digests)
    differ = [name for name, value in mine.digests if theirs.get(name) != value]
    where = f"reference: {reference.header.get('cpu')}, {reference.header['threads']} threads"
    if not differ:
        return True, (f"this machine reproduces the committed numbers bit for bit ({len(mine.digests)} digests equal; "
                      f"{where})")
    kernels = [n for n in differ if n.startswith("kernel ")]
    first = (kernels or differ)[0]
    return False, (f"this machine does not reproduce the committed numbers bit for bit: {len(differ)} of "
                   f"{len(mine.digests)} digests differ, the first at {first} ({where}; docs/reliability.md)")
