"""relconv's MinkUNet (relconv/voxel/models/minkunet.py) rebuilt on a peer's sparse conv API.

One skeleton, one `Backend` per peer: the module tree registers its convs, norms and the classifier
in exactly relconv's order (stem, down, up, fuse, classifier; main before shortcut in each residual
block), so `copy_weights` pairs them by position and converts each conv weight to the peer's layout.
Channel plan, kernel sizes, strides, concatenation order ([upsampled, skip]) and the 1x1x1 shortcut
(a plain matmul, as relconv runs it) all follow relconv's model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from relconv.voxel.models.minkunet import BASE_CHANNELS

if TYPE_CHECKING:
    from benchmarks.harness.bench import Prepared
    from benchmarks.harness.voxel_setup import E2ESetup


class Backend:
    """What the skeleton needs from a peer. `x` is the peer's sparse tensor type."""

    conv_types: tuple[type, ...] = ()  # the peer's conv module classes (for copy_weights)

    def tensor(self, feats: torch.Tensor, coords: torch.Tensor, batch_size: int):
        """The peer's sparse tensor of `feats` [N, C] at int32 (b, x, y, z) `coords`, x, y, z >= 0."""
        raise NotImplementedError

    def conv(
        self, cin: int, cout: int, kernel_size: int, stride: int, transposed: bool, key: str
    ) -> nn.Module:
        raise NotImplementedError

    def run_conv(self, conv: nn.Module, x, target=None):
        """Apply `conv`; a transposed conv gets the skip tensor whose coordinates it must produce."""
        raise NotImplementedError

    def feats(self, x) -> torch.Tensor:
        raise NotImplementedError

    def replace(self, x, feats: torch.Tensor):
        raise NotImplementedError

    def load_conv_weight(
        self, conv: nn.Module, weight: torch.Tensor, kernel_size: tuple[int, int, int]
    ) -> None:
        raise NotImplementedError


class Pointwise(nn.Module):
    """1x1x1 conv as relconv runs it: features @ weight[0], weight [1, C_in, C_out]."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, cin, cout))


class ConvBNReLU(nn.Module):
    def __init__(self, be: Backend, cin: int, cout: int, k: int, stride: int, transposed: bool, key: str):
        super().__init__()
        self.be = be
        self.conv = be.conv(cin, cout, k, stride, transposed, key)
        self.bn = nn.BatchNorm1d(cout)

    def forward(self, x, target=None):
        y = self.be.run_conv(self.conv, x, target)
        return self.be.replace(y, torch.relu(self.bn(self.be.feats(y))))


class Residual(nn.Module):
    def __init__(self, be: Backend, cin: int, cout: int, key: str):
        super().__init__()
        self.be = be
        self.conv1 = be.conv(cin, cout, 3, 1, False, key)
        self.bn1 = nn.BatchNorm1d(cout)
        self.conv2 = be.conv(cout, cout, 3, 1, False, key)
        self.bn2 = nn.BatchNorm1d(cout)
        self.proj = Pointwise(cin, cout) if cin != cout else None
        self.proj_bn = nn.BatchNorm1d(cout) if cin != cout else None

    def forward(self, x):
        be = self.be
        h = be.run_conv(self.conv1, x)
        h = be.replace(h, torch.relu(self.bn1(be.feats(h))))
        h = be.run_conv(self.conv2, h)
        main = self.bn2(be.feats(h))
        f = be.feats(x)
        short = f if self.proj is None else self.proj_bn(f @ self.proj.weight[0].to(f.dtype))
        return be.replace(h, torch.relu(main + short))


class PeerMinkUNet(nn.Module):
    def __init__(self, be: Backend, in_channels: int, num_classes: int, width: float):
        super().__init__()
        self.be = be
        cs = [max(1, int(round(c * width))) for c in BASE_CHANNELS]
        self.stem = nn.ModuleList(
            [
                ConvBNReLU(be, in_channels, cs[0], 3, 1, False, "subm0"),
                ConvBNReLU(be, cs[0], cs[0], 3, 1, False, "subm0"),
            ]
        )
        self.down = nn.ModuleList()
        for i in range(4):
            self.down.append(
                nn.ModuleList(
                    [
                        ConvBNReLU(be, cs[i], cs[i], 2, 2, False, f"down{i}"),
                        Residual(be, cs[i], cs[i + 1], f"subm{i + 1}"),
                        Residual(be, cs[i + 1], cs[i + 1], f"subm{i + 1}"),
                    ]
                )
            )
        self.up = nn.ModuleList()
        self.fuse = nn.ModuleList()
        for i in range(4):
            cin, cout, skip = cs[4 + i], cs[5 + i], cs[3 - i]
            self.up.append(ConvBNReLU(be, cin, cout, 2, 2, True, f"down{3 - i}"))
            self.fuse.append(
                nn.ModuleList(
                    [
                        Residual(be, cout + skip, cout, f"subm{3 - i}"),
                        Residual(be, cout, cout, f"subm{3 - i}"),
                    ]
                )
            )
        self.classifier = nn.Linear(cs[8], num_classes)

    def forward(self, x) -> torch.Tensor:
        be = self.be
        for layer in self.stem:
            x = layer(x)
        skips = [x]
        for conv, res1, res2 in self.down:
            skips.append(res2(res1(conv(skips[-1]))))
        y = skips.pop()
        for up, (res1, res2) in zip(self.up, self.fuse, strict=False):
            skip = skips.pop()
            y = up(y, target=skip)
            y = be.replace(y, torch.cat([be.feats(y), be.feats(skip)], 1))
            y = res2(res1(y))
        return self.classifier(be.feats(y))


def _param_modules(model: nn.Module, conv_types: tuple) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (*conv_types, nn.BatchNorm1d, nn.Linear))]


def copy_weights(relconv_model: nn.Module, peer: PeerMinkUNet) -> None:
    """Copies every conv (converted to the peer's layout), BatchNorm and the classifier, by position."""
    from relconv.voxel import Conv3d

    src = _param_modules(relconv_model, (Conv3d,))
    dst = _param_modules(peer, (*peer.be.conv_types, Pointwise))
    if len(src) != len(dst):
        raise RuntimeError(f"relconv MinkUNet has {len(src)} parameter modules, the peer's {len(dst)}")
    with torch.no_grad():
        for a, b in zip(src, dst, strict=False):
            if isinstance(a, Conv3d):
                if isinstance(b, Pointwise):
                    b.weight.copy_(a.weight)
                else:
                    peer.be.load_conv_weight(b, a.weight, a.kernel_size)
            elif isinstance(a, nn.BatchNorm1d) and isinstance(b, nn.BatchNorm1d):
                b.load_state_dict(a.state_dict())
            elif isinstance(a, nn.Linear) and isinstance(b, nn.Linear):
                b.load_state_dict(a.state_dict())
            else:
                raise RuntimeError(f"module order differs: {type(a).__name__} vs {type(b).__name__}")


def skeleton_case(setup: E2ESetup, backend: Backend) -> Prepared:
    """An end-to-end case on relconv's MinkUNet rebuilt on `backend`, from relconv's initial weights."""
    peer = PeerMinkUNet(backend, setup.in_channels, setup.num_classes, setup.spec["width"]).to(setup.device)
    copy_weights(setup.initial_model(), peer)
    coords, bs = setup.scene.coords, setup.scene.batch_size
    return setup.prepared(peer, lambda f: backend.tensor(f, coords, bs))
