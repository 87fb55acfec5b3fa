"""TorchSparse 2.1's `torchsparse.backbones` (SparseResNet21D, SparseResUNet42) and the MinkUNet of
TorchSparse's model zoo (SPVNAS)."""

from relconv.torchsparse.backbones.minkunet import MinkUNet
from relconv.torchsparse.backbones.resnet import SparseResNet, SparseResNet21D
from relconv.torchsparse.backbones.unet import SparseResUNet, SparseResUNet42

__all__ = ["MinkUNet", "SparseResNet", "SparseResNet21D", "SparseResUNet", "SparseResUNet42"]
